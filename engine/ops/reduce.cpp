// Reductions as a sequence of (outer, r, inner) single-dimension sums; backward broadcasts the
// gradient back with expand_to.
#include "engine/ops/reduce.h"

#include <algorithm>

#include "engine/autocast.h"
#include "engine/autograd/function.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/binary.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "kernels/error.h"
#include "kernels/reduce.h"

namespace rg {
namespace {

// Sorted, unique, non-negative dims; empty input means all dims.
std::vector<int64_t> normalize_dims(const char* op, const Tensor& x, std::vector<int64_t> dims) {
  const int64_t n = x.dim();
  if (dims.empty()) {
    for (int64_t d = 0; d < n; ++d) dims.push_back(d);
    return dims;
  }
  for (int64_t& d : dims) {
    RG_CHECK(d >= -n && d < n, op, ": dim ", d, " is out of range for a ", n, "-d tensor");
    if (d < 0) d += n;
  }
  std::sort(dims.begin(), dims.end());
  RG_CHECK(std::adjacent_find(dims.begin(), dims.end()) == dims.end(), op,
           ": a dimension is listed twice");
  return dims;
}

// Sum over `dims` with keepdim=true shape; no autograd.
Tensor sum_keepdim_raw(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor cur = x;
  // Reduce the highest dims first so that earlier dims keep their meaning.
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    const int64_t d = *it;
    const Shape& s = cur.shape();
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i) outer *= s[size_t(i)];
    for (size_t i = size_t(d) + 1; i < s.size(); ++i) inner *= s[i];
    Shape os = s;
    os[size_t(d)] = 1;
    Tensor out = Tensor::empty(os, cur.dtype(), cur.device());
    dispatch_on(cur.device(), cur.dtype(), "sum", [&]<class T, class B>() {
      kernels::Reduce<B>::sum_dim(cur.data<T>(), out.data<T>(), outer, s[size_t(d)], inner,
                                  kernel_ctx(cur));
    });
    cur = out;
  }
  if (cur.impl() == x.impl()) cur = x.detach().clone();  // no dims: still a new tensor
  return cur;
}

Shape drop_dims(const Shape& s, const std::vector<int64_t>& dims) {
  Shape out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!std::binary_search(dims.begin(), dims.end(), int64_t(i))) out.push_back(s[i]);
  }
  return out;
}

Shape keep_dims(const Shape& s, const std::vector<int64_t>& dims) {
  Shape out = s;
  for (int64_t d : dims) out[size_t(d)] = 1;
  return out;
}

}  // namespace

Tensor sum(const Tensor& x) { return sum(x, {}, false); }

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  if (auto c = autocast_inputs(AutocastPolicy::f32, {x})) return sum((*c)[0], dims_in, keepdim);
  check_inputs("sum", {x}, Formats::any);
  if (cpu_half_inputs({x})) return sum(half_to_f32(x), dims_in, keepdim).to(x.dtype());
  const std::vector<int64_t> dims = normalize_dims("sum", x, dims_in);
  const bool all = dims.size() == size_t(x.dim()) && x.dim() > 0;
  if (!all) check_inputs("sum", {x});  // over some dimensions: by position, contiguous only
  Tensor out;
  if (all) {
    out = Tensor::empty(keepdim ? keep_dims(x.shape(), dims) : Shape{}, x.dtype(), x.device());
    dispatch_on(x.device(), x.dtype(), "sum", [&]<class T, class B>() {
      using K = kernels::Reduce<B>;
      const Tensor ws =
          Tensor::empty({K::sum_all_workspace_bytes(x.numel())}, DType::u8, x.device());
      K::sum_all(x.data<T>(), x.numel(), out.data<T>(),
                 kernels::Workspace{ws.raw_data(), ws.numel()}, kernel_ctx(x));
    });
  } else {
    Tensor k = sum_keepdim_raw(x.detach(), dims);
    out = keepdim ? k : k.detach().view(drop_dims(x.shape(), dims));
  }
  const Shape in_shape = x.shape();
  const Shape kept = keep_dims(x.shape(), dims);
  return autograd::record(out, "SumBackward", {x}, [in_shape, kept](const Tensor& g) {
    return std::vector<Tensor>{expand_to(g.view(kept), in_shape)};
  });
}

Tensor mean(const Tensor& x) { return mean(x, {}, false); }

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  check_inputs("mean", {x}, Formats::any);  // sum checks the format against the dimensions
  if (cpu_half_inputs({x})) return mean(half_to_f32(x), dims_in, keepdim).to(x.dtype());
  const NoAutocastGuard follows_its_input;  // its sum stays in x's dtype, as PyTorch's mean
  const std::vector<int64_t> dims = normalize_dims("mean", x, dims_in);
  if (dims.size() != size_t(x.dim())) check_inputs("mean", {x});  // by position: contiguous
  int64_t count = 1;
  for (int64_t d : dims) count *= x.shape()[size_t(d)];
  RG_CHECK(count > 0, "mean: reducing over an empty dimension");
  return mul(sum(x, dims, keepdim), 1.0 / double(count));
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const Shape& s = x.shape();
  RG_CHECK(shape.size() <= s.size(), "sum_to: cannot reduce shape ", shape_str(s), " to ",
           shape_str(shape));
  const size_t lead = s.size() - shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i < lead) {
      dims.push_back(int64_t(i));
    } else if (shape[i - lead] == 1 && s[i] != 1) {
      dims.push_back(int64_t(i));
    } else {
      RG_CHECK(shape[i - lead] == s[i], "sum_to: cannot reduce shape ", shape_str(s), " to ",
               shape_str(shape));
    }
  }
  if (dims.empty()) return x.view(shape);
  return sum(x, dims, true).view(shape);
}

Tensor expand_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  broadcast_shapes(x.shape(), shape, "expand_to");
  // zeros(shape) + x broadcasts x; the addition of zeros is exact.
  Tensor out = add(zeros(shape, x.dtype(), x.device()), x.detach());
  const Shape in_shape = x.shape();
  return autograd::record(out, "ExpandBackward", {x}, [in_shape](const Tensor& g) {
    return std::vector<Tensor>{sum_to(g, in_shape)};
  });
}

}  // namespace rg
