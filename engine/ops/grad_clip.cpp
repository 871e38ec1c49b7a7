// total_norm, scale_by_clip_coef_ and clamp_ through kernels/grad_clip.h: the norm accumulates
// tensor by tensor into one f64 value on the device, so a CUDA norm needs no synchronization.
#include "engine/ops/grad_clip.h"

#include <cmath>

#include "engine/autograd/function.h"
#include "engine/dispatch.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "kernels/error.h"
#include "kernels/grad_clip.h"

namespace rg {

Tensor total_norm(const std::vector<Tensor>& tensors, double norm_type) {
  RG_CHECK(!tensors.empty(), "total_norm: needs at least one tensor");
  RG_CHECK(norm_type > 0.0, "total_norm: norm_type must be > 0 (or inf), got ", norm_type);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    RG_CHECK(t.defined(), "total_norm: input ", i, " is an undefined tensor");
    RG_CHECK(t.device() == tensors[0].device(), "total_norm: input ", i, " is on ",
             t.device().str(), " but input 0 is on ", tensors[0].device().str());
    RG_CHECK(t.dtype() == tensors[0].dtype(), "total_norm: dtype mismatch: input ", i, " is ",
             dtype_name(t.dtype()), " but input 0 is ", dtype_name(tensors[0].dtype()));
  }
  const Tensor& first = tensors[0];
  Tensor acc = zeros({1}, DType::f64, first.device());
  Tensor out = Tensor::empty({}, first.dtype(), first.device());
  dispatch_on(first.device(), first.dtype(), "total_norm", [&]<class T, class B>() {
    using K = kernels::GradClip<B>;
    const Tensor ws = Tensor::empty({K::norm_workspace_bytes(0)}, DType::u8, first.device());
    for (const Tensor& t : tensors) {
      K::template norm_accumulate<T>(t.data<T>(), t.numel(), norm_type, acc.data<double>(),
                                     kernels::Workspace{ws.raw_data(), ws.numel()},
                                     kernel_ctx(first));
    }
    K::template norm_finish<T>(acc.data<double>(), norm_type, out.data<T>(), kernel_ctx(first));
  });
  return out;
}

Tensor& scale_by_clip_coef_(Tensor& x, const Tensor& total_norm, double max_norm) {
  check_inputs("scale_by_clip_coef_", {x, total_norm}, Formats::any);  // elementwise on x
  RG_CHECK(total_norm.numel() == 1, "scale_by_clip_coef_: total_norm must have one element, got ",
           shape_str(total_norm.shape()));
  RG_CHECK(max_norm >= 0.0, "scale_by_clip_coef_: max_norm must be >= 0, got ", max_norm);
  RG_CHECK(!autograd::needs_grad({x}),
           "scale_by_clip_coef_: in-place update of a tensor that requires grad; wrap it in "
           "NoGradGuard");
  dispatch_on(x.device(), x.dtype(), "scale_by_clip_coef_", [&]<class T, class B>() {
    kernels::GradClip<B>::template scale_by_clip_coef<T>(
        x.data<T>(), x.numel(), total_norm.data<T>(), max_norm, kernel_ctx(x));
  });
  x.bump_version();
  return x;
}

Tensor& clamp_(Tensor& x, double min, double max) {
  check_inputs("clamp_", {x}, Formats::alike);
  RG_CHECK(!std::isnan(min) && !std::isnan(max) && min <= max,
           "clamp_: needs min <= max (neither NaN), got min ", min, " and max ", max);
  RG_CHECK(!autograd::needs_grad({x}),
           "clamp_: in-place update of a tensor that requires grad; wrap it in NoGradGuard");
  dispatch_on(x.device(), x.dtype(), "clamp_", [&]<class T, class B>() {
    kernels::GradClip<B>::template clamp<T>(x.data<T>(), x.numel(), min, max, kernel_ctx(x));
  });
  x.bump_version();
  return x;
}

}  // namespace rg
