// batch_norm forward and backward through kernels::cpu::batch_norm or kernels::cuda (f32 stats).
// The per-channel mean and 1/sqrt(var + eps) used by the forward are kept (in double) for the
// backward.
#include "engine/ops/batch_norm.h"

#include <array>
#include <cmath>
#include <memory>
#include <vector>

#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/dispatch.h"
#include "engine/ops/binary.h"
#include "engine/ops/check.h"
#include "engine/ops/unary.h"
#include "kernels/cpu/batch_norm.h"
#include "kernels/cuda/batch_norm_stats.h"
#include "kernels/error.h"

namespace rg {

using autograd::SavedTensor;

namespace {

void check_channel_tensor(const Tensor& t, const char* name, const Tensor& x, int64_t c) {
  if (!t.defined()) return;
  check_inputs("batch_norm", {x, t});
  RG_CHECK(t.dim() == 1 && t.size(0) == c, "batch_norm: ", name, " has shape ",
           shape_str(t.shape()), " but input ", shape_str(x.shape()), " has ", c, " channels");
}

// The backward's outputs dx, dweight, dbias: uninitialized where wanted, undefined otherwise.
std::array<Tensor, 3> gradient_outputs(const Tensor& grad, const Shape& x_shape, int64_t c, bool gx,
                                       bool gw, bool gb) {
  const auto make = [&](bool wanted, const Shape& s) {
    return wanted ? Tensor::empty(s, grad.dtype(), grad.device()) : Tensor();
  };
  return {make(gx, x_shape), make(gw, {c}), make(gb, {c})};
}

// f32, f16 and bf16: the instantiations of the CUDA batch-norm kernels.
template <class F>
void dispatch_batch_norm_cuda(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::f16:
      return f.template operator()<Half>();
    case DType::bf16:
      return f.template operator()<BFloat16>();
    default:
      RG_FAIL("batch_norm: ", dtype_name(t),
              " is not implemented on CUDA yet; use f32, f16 or bf16");
  }
}

// The CUDA path (kernels/cuda/batch_norm_stats.h): f32 per-channel statistics on the device, kept
// for the backward; f32, f16 and bf16 inputs (the kernels have no f64 instantiation).
Tensor batch_norm_cuda(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum,
                       double eps, int64_t n, int64_t c, int64_t hw) {
  void* stream = cuda_stream(x);
  Tensor mean = Tensor::empty({c}, DType::f32, x.device());
  Tensor invstd = Tensor::empty({c}, DType::f32, x.device());
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_batch_norm_cuda(x.dtype(), [&]<class T>() {
    if (training) {
      Tensor var = Tensor::empty({c}, DType::f32, x.device());
      kernels::cuda::batch_norm_stats<T>(x.data<T>(), n, c, hw, mean.data<float>(),
                                         var.data<float>(), invstd.data<float>(), eps, stream);
      if (running_mean.defined()) {
        kernels::cuda::batch_norm_update_running<T>(running_mean.data<T>(), running_var.data<T>(),
                                                    mean.data<float>(), var.data<float>(), c,
                                                    n * hw, momentum, stream);
        running_mean.bump_version();
        running_var.bump_version();
      }
    } else {  // invstd = 1 / sqrt(running_var + eps), in f32
      NoGradGuard no_grad;
      mean.copy_(running_mean);
      invstd.copy_(rdiv(sqrt(add(running_var.to(DType::f32), eps)), 1.0));
    }
    kernels::cuda::batch_norm_apply<T>(
        x.data<T>(), n, c, hw, mean.data<float>(), invstd.data<float>(),
        weight.defined() ? weight.data<T>() : nullptr, bias.defined() ? bias.data<T>() : nullptr,
        out.data<T>(), stream);
  });
  const bool gx = autograd::needs_grad({x}), gw = autograd::needs_grad({weight});
  const bool gb = autograd::needs_grad({bias});
  return autograd::record(
      out, "BatchNormBackward", {x, weight, bias},
      [sx = SavedTensor(x), sw = SavedTensor(weight), mean, invstd, training, gx, gw, gb, n, c,
       hw](const Tensor& grad) -> std::vector<Tensor> {
        const Tensor xv = sx.get(), wv = sw.get();
        auto [dx, dw, db] = gradient_outputs(grad, xv.shape(), c, gx, gw, gb);
        dispatch_batch_norm_cuda(grad.dtype(), [&]<class T>() {
          kernels::cuda::batch_norm_backward<T>(
              grad.data<T>(), xv.data<T>(), n, c, hw, mean.data<float>(), invstd.data<float>(),
              wv.defined() ? wv.data<T>() : nullptr, training, gx ? dx.data<T>() : nullptr,
              gw ? dw.data<T>() : nullptr, gb ? db.data<T>() : nullptr, cuda_stream(grad));
        });
        return {dx, dw, db};
      });
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps) {
  const char* op = "batch_norm";
  check_inputs(op, {x});
  RG_CHECK(x.dim() == 2 || x.dim() == 4, op,
           ": expected a 2-d [N, C] or 4-d [N, C, H, W] input, got shape ", shape_str(x.shape()));
  const int64_t n = x.size(0), c = x.size(1), hw = x.dim() == 4 ? x.size(2) * x.size(3) : 1;
  check_channel_tensor(running_mean, "running_mean", x, c);
  check_channel_tensor(running_var, "running_var", x, c);
  check_channel_tensor(weight, "weight", x, c);
  check_channel_tensor(bias, "bias", x, c);
  RG_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
  RG_CHECK(running_mean.defined() == running_var.defined(), op,
           ": running_mean and running_var must both be defined or both undefined");
  RG_CHECK(
      !(running_mean.defined() && (running_mean.requires_grad() || running_var.requires_grad())),
      op, ": running_mean/running_var are statistics updated in place and must not require grad");
  const int64_t count = n * hw;
  if (training) {
    RG_CHECK(count > 1, op, ": expected more than 1 value per channel when training, got input ",
             shape_str(x.shape()));
  } else {
    RG_CHECK(running_mean.defined(), op,
             ": running_mean and running_var are required in evaluation mode (training=false)");
  }

  if (x.device().is_cuda()) {
    return batch_norm_cuda(x, running_mean, running_var, weight, bias, training, momentum, eps, n,
                           c, hw);
  }

  // mean and invstd per channel, shared with the backward.
  auto mean = std::make_shared<std::vector<double>>(size_t(c));
  auto invstd = std::make_shared<std::vector<double>>(size_t(c));
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), op, [&]<class T>() {
    std::vector<double> var(static_cast<size_t>(c));
    if (training) {
      kernels::cpu::batch_norm_stats<T>(x.data<T>(), n, c, hw, mean->data(), var.data());
      if (running_mean.defined()) {
        kernels::cpu::batch_norm_update_running<T>(running_mean.data<T>(), running_var.data<T>(),
                                                   mean->data(), var.data(), c, count, momentum);
        running_mean.bump_version();
        running_var.bump_version();
      }
    } else {
      const T* rm = running_mean.data<T>();
      const T* rv = running_var.data<T>();
      for (int64_t ch = 0; ch < c; ++ch) {
        (*mean)[size_t(ch)] = double(rm[ch]);
        var[size_t(ch)] = double(rv[ch]);
      }
    }
    for (int64_t ch = 0; ch < c; ++ch) {
      (*invstd)[size_t(ch)] = 1.0 / std::sqrt(var[size_t(ch)] + eps);
    }
    kernels::cpu::batch_norm_apply<T>(x.data<T>(), n, c, hw, mean->data(), invstd->data(),
                                      weight.defined() ? weight.data<T>() : nullptr,
                                      bias.defined() ? bias.data<T>() : nullptr, out.data<T>());
  });

  const bool gx = autograd::needs_grad({x}), gw = autograd::needs_grad({weight});
  const bool gb = autograd::needs_grad({bias});
  return autograd::record(out, "BatchNormBackward", {x, weight, bias},
                          [sx = SavedTensor(x), sw = SavedTensor(weight), mean, invstd, training,
                           gx, gw, gb, n, c, hw](const Tensor& grad) -> std::vector<Tensor> {
                            const Tensor xv = sx.get(), wv = sw.get();
                            auto [dx, dw, db] = gradient_outputs(grad, xv.shape(), c, gx, gw, gb);
                            dispatch_float(grad.dtype(), "batch_norm backward", [&]<class T>() {
                              kernels::cpu::batch_norm_backward<T>(
                                  grad.data<T>(), xv.data<T>(), n, c, hw, mean->data(),
                                  invstd->data(), wv.defined() ? wv.data<T>() : nullptr, training,
                                  gx ? dx.data<T>() : nullptr, gw ? dw.data<T>() : nullptr,
                                  gb ? db.data<T>() : nullptr);
                            });
                            return {dx, dw, db};
                          });
}

}  // namespace rg
