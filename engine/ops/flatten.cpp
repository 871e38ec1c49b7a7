// flatten as Tensor::view: storage is shared and view() already records the backward. A
// channels_last tensor is made contiguous first (a layout conversion, as torch.flatten's reshape
// copies it).
#include "engine/ops/flatten.h"

#include <algorithm>

#include "kernels/error.h"

namespace rg {

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  RG_CHECK(x.defined(), "flatten: input is an undefined tensor");
  const int64_t n = std::max<int64_t>(x.dim(), 1);  // a 0-d tensor accepts dims 0 and -1
  const auto normalize = [&x, n](int64_t d, const char* name) {
    RG_CHECK(d >= -n && d < n, "flatten: ", name, " ", d, " is out of range for shape ",
             shape_str(x.shape()));
    return d < 0 ? d + n : d;
  };
  const int64_t start = normalize(start_dim, "start_dim"), end = normalize(end_dim, "end_dim");
  RG_CHECK(start <= end, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim,
           " for shape ", shape_str(x.shape()));
  if (x.dim() == 0) return x.view({1});
  Shape shape(x.shape().begin(), x.shape().begin() + start);
  int64_t merged = 1;
  for (int64_t d = start; d <= end; ++d) merged *= x.size(d);
  shape.push_back(merged);
  shape.insert(shape.end(), x.shape().begin() + end + 1, x.shape().end());
  if (shape != x.shape() && x.memory_format() != MemoryFormat::contiguous) {
    return x.contiguous().view(shape);
  }
  return x.view(shape);
}

}  // namespace rg
