// argmax, top-k hit counting and accuracy: checks here, the counting in kernels/metrics.h (one call
// per kernel on both devices), and what a bad target means decided once, for both devices.
#include "engine/ops/metrics.h"

#include <algorithm>

#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/check.h"
#include "kernels/error.h"
#include "kernels/metrics.h"

namespace rg {

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  if (cpu_half_inputs({x})) return argmax(half_to_f32(x), dim, keepdim);
  check_inputs("argmax", {x});
  const int64_t n = std::max<int64_t>(x.dim(), 1);  // a 0-d tensor has one element at index 0
  RG_CHECK(dim >= -n && dim < n, "argmax: dim ", dim, " is out of range for shape ",
           shape_str(x.shape()));
  if (dim < 0) dim += n;
  const int64_t c = x.dim() == 0 ? 1 : x.size(dim);
  RG_CHECK(c > 0, "argmax: cannot take the argmax of an empty dimension (shape ",
           shape_str(x.shape()), ", dim ", dim, ")");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  Shape shape = x.shape();
  if (x.dim() > 0) {
    if (keepdim) {
      shape[size_t(dim)] = 1;
    } else {
      shape.erase(shape.begin() + dim);
    }
  }
  Tensor out = Tensor::empty(shape, DType::i64, x.device());
  dispatch_on(x.device(), x.dtype(), "argmax", [&]<class T, class B>() {
    kernels::Metrics<B>::argmax(x.data<T>(), out.data<int64_t>(), outer, c, inner, kernel_ctx(x));
  });
  return out;
}

int64_t topk_correct(const Tensor& logits, const Tensor& target, int64_t k) {
  if (cpu_half_inputs({logits})) return topk_correct(half_to_f32(logits), target, k);
  check_inputs("topk_correct", {logits});
  check_dim("topk_correct", logits, 2, "[N, C]");
  RG_CHECK(target.defined() && target.dtype() == DType::i64 && target.dim() == 1 &&
               target.size(0) == logits.size(0),
           "topk_correct: target must be an i64 tensor of shape [", logits.size(0), "], got ",
           target.defined() ? dtype_name(target.dtype()) : "undefined", " ",
           target.defined() ? shape_str(target.shape()) : "");
  const int64_t n = logits.size(0), c = logits.size(1);
  RG_CHECK(k >= 1 && k <= c, "topk_correct: k = ", k, " must be in [1, ", c, "] for ", c,
           " classes");
  RG_CHECK(target.device() == logits.device(), "topk_correct: target is on ", target.device().str(),
           " but logits are on ", logits.device().str());
  Tensor counts = Tensor::empty({2}, DType::i64, logits.device());
  dispatch_on(logits.device(), logits.dtype(), "topk_correct", [&]<class T, class B>() {
    kernels::Metrics<B>::topk_correct(logits.data<T>(), target.data<int64_t>(), n, c, k,
                                      counts.data<int64_t>(), kernel_ctx(logits));
  });
  const std::vector<int64_t> got = counts.to(Device::cpu()).to_vector<int64_t>();
  if (got[1] < n) {  // the same error on every device (one more copy, on this path only)
    const int64_t bad = target.narrow(0, got[1], 1).to(Device::cpu()).to_vector<int64_t>()[0];
    RG_FAIL("topk_correct: target ", bad, " at index ", got[1], " is out of range for ", c,
            " classes");
  }
  return got[0];
}

double accuracy(const Tensor& logits, const Tensor& target, int64_t k) {
  check_inputs("accuracy", {logits});
  check_dim("accuracy", logits, 2, "[N, C]");
  RG_CHECK(logits.size(0) > 0, "accuracy: needs at least one row, got shape ",
           shape_str(logits.shape()));
  return double(topk_correct(logits, target, k)) / double(logits.size(0));
}

}  // namespace rg
