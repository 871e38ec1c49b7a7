// layer_norm forward and backward through kernels/layer_norm.h's kernels on both devices. The
// per-row mean and 1/sqrt(var + eps) of the forward (f64 for f64 inputs, f32 otherwise) are kept
// for the backward.
#include "engine/ops/layer_norm.h"

#include <vector>

#include "engine/autograd/function.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/check.h"
#include "kernels/error.h"
#include "kernels/layer_norm.h"

namespace rg {

using autograd::SavedTensor;

namespace {

void check_param(const char* op, const Tensor& t, const char* name, const Tensor& x, int64_t d) {
  if (!t.defined()) return;
  check_inputs(op, {x, t});
  RG_CHECK(t.dim() == 1 && t.size(0) == d, op, ": ", name, " has shape ", shape_str(t.shape()),
           " but input ", shape_str(x.shape()), " is normalized over its last dimension of ", d);
}

DType stat_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = "layer_norm";
  if (auto c = autocast_inputs(AutocastPolicy::f32, {x, weight, bias}))
    return layer_norm((*c)[0], (*c)[1], (*c)[2], eps);
  check_inputs(op, {x});
  RG_CHECK(x.dim() >= 1, op, ": expected an input of at least 1 dimension, got shape ",
           shape_str(x.shape()));
  const int64_t d = x.size(x.dim() - 1);
  const int64_t rows = d > 0 ? x.numel() / d : 0;
  check_param(op, weight, "weight", x, d);
  check_param(op, bias, "bias", x, d);
  RG_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
  if (cpu_half_inputs({x, weight, bias})) {
    return layer_norm(half_to_f32(x), half_to_f32(weight), half_to_f32(bias), eps).to(x.dtype());
  }

  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const Tensor mean = Tensor::empty({rows}, stat_dtype(x.dtype()), x.device());
  const Tensor rstd = Tensor::empty({rows}, stat_dtype(x.dtype()), x.device());
  dispatch_on(x.device(), x.dtype(), op, [&]<class T, class B>() {
    using S = kernels::LayerNormStat<T>;
    kernels::LayerNorm<B>::forward(x.data<T>(), rows, d,
                                   weight.defined() ? weight.data<T>() : nullptr,
                                   bias.defined() ? bias.data<T>() : nullptr, eps, out.data<T>(),
                                   mean.data<S>(), rstd.data<S>(), kernel_ctx(x));
  });
  const bool gx = autograd::needs_grad({x}), gw = autograd::needs_grad({weight});
  const bool gb = autograd::needs_grad({bias});
  return autograd::record(
      out, "LayerNormBackward", {x, weight, bias},
      [sx = SavedTensor(x), sw = SavedTensor(weight), mean, rstd, gx, gw, gb, rows,
       d](const Tensor& grad) -> std::vector<Tensor> {
        const Tensor xv = sx.get(), wv = sw.get();
        const auto make = [&](bool wanted, const Shape& s) {
          return wanted ? Tensor::empty(s, grad.dtype(), grad.device()) : Tensor();
        };
        Tensor dx = make(gx, xv.shape()), dw = make(gw, {d}), db = make(gb, {d});
        dispatch_on(grad.device(), grad.dtype(), "layer_norm backward", [&]<class T, class B>() {
          using K = kernels::LayerNorm<B>;
          using S = kernels::LayerNormStat<T>;
          const int64_t bytes = gw || gb ? K::backward_workspace_bytes(rows, d) : 0;
          const Tensor ws = Tensor::empty({bytes}, DType::u8, grad.device());
          K::template backward<T>(grad.data<T>(), xv.data<T>(), rows, d, mean.data<S>(),
                                  rstd.data<S>(), wv.defined() ? wv.data<T>() : nullptr,
                                  gx ? dx.data<T>() : nullptr, gw ? dw.data<T>() : nullptr,
                                  gb ? db.data<T>() : nullptr,
                                  kernels::Workspace{ws.raw_data(), ws.numel()}, kernel_ctx(grad));
        });
        return {dx, dw, db};
      });
}

}  // namespace rg
