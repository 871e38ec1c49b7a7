// batch_norm forward and backward through kernels/batch_norm.h's kernels on both devices (f64
// per-channel statistics) or, on CUDA, cuDNN (f32 statistics; engine/ops/cudnn.h switches). The
// per-channel mean and 1/sqrt(var + eps) used by the forward are kept for the backward.
#include "engine/ops/batch_norm.h"

#include <array>
#include <cmath>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/binary.h"
#include "engine/ops/check.h"
#include "engine/ops/cudnn.h"
#include "engine/ops/factory.h"
#include "engine/ops/unary.h"
#include "kernels/batch_norm.h"
#include "kernels/cuda/batch_norm_cudnn.h"
#include "kernels/error.h"

namespace rg {

using autograd::SavedTensor;

namespace {

// mixed: t must be f32 on x's device (f16/bf16 x, f32 parameters); otherwise x's dtype.
void check_channel_tensor(const char* op, const Tensor& t, const char* name, const Tensor& x,
                          int64_t c, bool mixed) {
  if (!t.defined()) return;
  if (mixed) {
    RG_CHECK(t.dtype() == DType::f32, op, ": ", name, " is ", dtype_name(t.dtype()),
             " where the other parameters are f32 for ", dtype_name(x.dtype()), " input");
    RG_CHECK(t.device() == x.device(), op, ": device mismatch, input 0 is on ", x.device().str(),
             " but ", name, " is on ", t.device().str());
  } else {
    check_inputs(op, {x, t}, Formats::any);
  }
  RG_CHECK(t.dim() == 1 && t.size(0) == c, op, ": ", name, " has shape ", shape_str(t.shape()),
           " but input ", shape_str(x.shape()), " has ", c, " channels");
}

// The backward's outputs dx (like x), dweight, dbias (those two in the parameters' dtype):
// uninitialized where wanted, undefined otherwise.
std::array<Tensor, 3> gradient_outputs(const Tensor& grad, const Tensor& x, int64_t c, bool gx,
                                       bool gw, bool gb, DType param_dtype) {
  const auto make = [&](bool wanted, const Shape& s, DType dtype) {
    return wanted ? Tensor::empty(s, dtype, grad.device()) : Tensor();
  };
  return {gx ? Tensor::empty(x.shape(), grad.dtype(), grad.device(), x.memory_format()) : Tensor(),
          make(gw, {c}, param_dtype), make(gb, {c}, param_dtype)};
}

// Whether x is f16/bf16 on CUDA with f32 parameters and statistics (autocast's BatchNorm2d; at
// least one defined, all defined ones f32): then our kernels take them as they are (P = f32), with
// no f32 copies of x, the output or the gradients (batch_norm_through_f32's way, as the CPU's).
bool cuda_mixed(const Tensor& x, std::initializer_list<Tensor> params) {
  if (!x.defined() || !x.device().is_cuda() || !is_half(x.dtype())) return false;
  bool any = false;
  for (const Tensor& t : params) {
    if (!t.defined()) continue;
    if (t.dtype() != DType::f32) return false;
    any = true;
  }
  return any;
}

// f.template operator()<T, P, B>() for x's dtype T and backend B, with P = f32 when mixed (see
// cuda_mixed), else T.
template <class F>
void dispatch_batch_norm(const Tensor& x, bool mixed, const char* op, F&& f) {
  dispatch_on(x.device(), x.dtype(), op, [&]<class T, class B>() {
    if constexpr (kOnCuda<B> && (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)) {
      if (mixed) return f.template operator()<T, float, B>();
    }
    f.template operator()<T, T, B>();
  });
}

// The storage types cuDNN's batch norm is asked for: f32, and f16 (given f32 copies of its f16
// parameters). bf16 stays on our kernels, as in PyTorch: we could not find the legacy calls' bf16
// support documented; so do f16/bf16 activations with f32 parameters (cuda_mixed).
template <class T>
constexpr bool kCudnnType = std::is_same_v<T, float> || std::is_same_v<T, Half>;

// Whether this batch norm goes through cuDNN: the switch is on, the dtype is one of kCudnnType's,
// and cuDNN takes the size and eps (kernels::cuda::cudnn_batch_norm_supported: non-empty, eps at
// least CUDNN_BN_MIN_EPSILON, cuDNN's batch limits). Everything else runs our kernels.
bool use_cudnn(DType t, int64_t n, int64_t c, int64_t hw, double eps, bool training) {
  return cudnn_enabled() && (t == DType::f32 || t == DType::f16) &&
         kernels::cuda::cudnn_batch_norm_supported(n, c, hw, eps, training);
}

// A [c] channel tensor as cuDNN's f32 parameter (itself when f32), or `fill` where undefined.
Tensor f32_param(const Tensor& t, int64_t c, double fill, Device device) {
  return t.defined() ? t.detach().to(DType::f32) : full({c}, fill, DType::f32, device);
}

// The forward through cuDNN (training: batch statistics, the running ones updated, mean and
// invstd saved; inference: running statistics). cuDNN keeps f32 statistics and parameters: f16
// ones go through f32 copies.
template <class T>
void forward_cudnn(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                   const Tensor& weight, const Tensor& bias, bool training, double momentum,
                   double eps, int64_t n, int64_t c, int64_t hw, Tensor& out, Tensor& mean,
                   Tensor& invstd) {
  NoGradGuard no_grad;
  void* stream = cuda_stream(x);
  const Tensor w32 = f32_param(weight, c, 1.0, x.device());
  const Tensor b32 = f32_param(bias, c, 0.0, x.device());
  const bool running = running_mean.defined();
  const Tensor rm32 = running ? running_mean.to(DType::f32) : Tensor();
  const Tensor rv32 = running ? running_var.to(DType::f32) : Tensor();
  if (!training) {
    kernels::cuda::cudnn_batch_norm_forward_inference<T>(
        x.data<T>(), n, c, hw, w32.data<float>(), b32.data<float>(), rm32.data<float>(),
        rv32.data<float>(), eps, out.data<T>(), stream);
    return;
  }
  kernels::cuda::cudnn_batch_norm_forward_training<T>(
      x.data<T>(), n, c, hw, w32.data<float>(), b32.data<float>(), momentum,
      running ? rm32.data<float>() : nullptr, running ? rv32.data<float>() : nullptr, eps,
      out.data<T>(), mean.data<float>(), invstd.data<float>(), stream);
  if (!running) return;
  if (running_mean.dtype() != DType::f32) {  // Tensor is a handle: these write the caller's
    Tensor(running_mean).copy_(rm32);
    Tensor(running_var).copy_(rv32);
  }
  running_mean.bump_version();
  running_var.bump_version();
}

// f64 mean and invstd = 1 / sqrt(running_var + eps) from the running statistics (eval mode).
std::array<Tensor, 2> running_statistics(const Tensor& running_mean, const Tensor& running_var,
                                         double eps) {
  NoGradGuard no_grad;
  return {running_mean.to(DType::f64), rdiv(sqrt(add(running_var.to(DType::f64), eps)), 1.0)};
}

// Scratch memory for BatchNorm<B>'s stats and backward on x's device.
template <class B>
Tensor batch_norm_workspace(int64_t n, int64_t c, int64_t hw, Device device) {
  return Tensor::empty({kernels::BatchNorm<B>::workspace_bytes(n, c, hw)}, DType::u8, device);
}
kernels::Workspace as_workspace(const Tensor& ws) { return {ws.raw_data(), ws.numel()}; }

// The backward of our kernels from f64 mean and invstd, on either device; relu: of the fused
// batch_norm_relu, whose relu mask the kernels recompute from x, weight and bias, or, given the
// op's output `out`, of batch_norm_add_relu, whose mask is out > 0 (relu_backward's; the output
// is saved by whatever consumes it anyway, where the residual often would not be: a downsample
// branch's batch norm output). With a residual (has_residual) the op's fourth input is the
// residual, whose gradient comes last.
autograd::BackwardFn kernels_backward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                      const Tensor& out, bool has_residual, bool mixed, Tensor mean,
                                      Tensor invstd, bool training, bool relu, bool gx, bool gw,
                                      bool gb, bool gr, int64_t n, int64_t c, int64_t hw) {
  return [sx = SavedTensor(x), sw = SavedTensor(weight),
          sb = SavedTensor(relu && !out.defined() ? bias : Tensor()), so = SavedTensor(out),
          has_residual, mixed, mean, invstd, training, relu, gx, gw, gb, gr, n, c,
          hw](const Tensor& grad) -> std::vector<Tensor> {
    const Tensor xv = sx.get(), wv = sw.get(), bv = sb.get(), yv = so.get();
    auto [dx, dw, db] =
        gradient_outputs(grad, xv, c, gx, gw, gb, mixed ? DType::f32 : grad.dtype());
    // The CPU kernel materializes relu's backward (the residual's gradient) before the plain
    // backward: it gets a buffer from the tensor allocator even when no residual gradient is
    // wanted, rather than a fresh allocation of its own per call.
    const bool cpu_relu = relu && grad.device().is_cpu();
    const Tensor dr =
        gr || cpu_relu ? Tensor::empty(xv.shape(), grad.dtype(), grad.device(), xv.memory_format())
                       : Tensor();
    dispatch_batch_norm(grad, mixed, "batch_norm backward", [&]<class T, class P, class B>() {
      const Tensor ws = batch_norm_workspace<B>(n, c, hw, grad.device());
      const auto ptr = []<class U = T>(const Tensor& t) {
        return t.defined() ? t.data<U>() : nullptr;
      };
      kernels::BatchNorm<B>::template backward<T, P>(
          grad.data<T>(), xv.data<T>(), n, c, hw, mean.data<double>(), invstd.data<double>(),
          ptr.template operator()<P>(wv), ptr.template operator()<P>(bv), ptr(yv), training, relu,
          ptr(dx), ptr.template operator()<P>(dw), ptr.template operator()<P>(db), ptr(dr),
          as_workspace(ws), kernel_ctx(grad));
    });
    if (has_residual) return {dx, dw, db, gr ? dr : Tensor()};
    return {dx, dw, db};
  };
}

// Our kernels, on either device: f64 mean and invstd per channel, kept for the backward; relu:
// the fused batch_norm_relu; residual (defined: batch_norm_add_relu) added before relu. The
// statistics and the normalization are two dispatches; one span on the trace holds both.
Tensor batch_norm_kernels(const char* op, const Tensor& x, const Tensor& running_mean,
                          const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                          const Tensor& residual, bool training, bool relu, bool mixed,
                          double momentum, double eps, int64_t n, int64_t c, int64_t hw) {
  const cuda::OpSpan span(op, "op", x.device());
  Tensor mean, invstd;
  Tensor out = empty_like(x);
  if (training) {
    mean = Tensor::empty({c}, DType::f64, x.device());
    invstd = Tensor::empty({c}, DType::f64, x.device());
    const Tensor var = Tensor::empty({c}, DType::f64, x.device());
    dispatch_batch_norm(x, mixed, op, [&]<class T, class P, class B>() {
      using K = kernels::BatchNorm<B>;
      const Tensor ws = batch_norm_workspace<B>(n, c, hw, x.device());
      K::stats(x.data<T>(), n, c, hw, mean.data<double>(), var.data<double>(),
               invstd.data<double>(), eps, as_workspace(ws), kernel_ctx(x));
      if (running_mean.defined()) {
        K::update_running(running_mean.data<P>(), running_var.data<P>(), mean.data<double>(),
                          var.data<double>(), c, n * hw, momentum, kernel_ctx(x));
      }
    });
    if (running_mean.defined()) {
      running_mean.bump_version();
      running_var.bump_version();
    }
  } else {
    const auto stats = running_statistics(running_mean, running_var, eps);
    mean = stats[0];
    invstd = stats[1];
  }
  dispatch_batch_norm(x, mixed, op, [&]<class T, class P, class B>() {
    const auto ptr = []<class U>(const Tensor& t) { return t.defined() ? t.data<U>() : nullptr; };
    kernels::BatchNorm<B>::template apply<T, P>(
        x.data<T>(), n, c, hw, mean.data<double>(), invstd.data<double>(),
        ptr.template operator()<P>(weight), ptr.template operator()<P>(bias),
        ptr.template operator()<T>(residual), relu, out.data<T>(), kernel_ctx(x));
  });
  const bool gx = autograd::needs_grad({x}), gw = autograd::needs_grad({weight});
  const bool gb = autograd::needs_grad({bias});
  const bool gr = residual.defined() && autograd::needs_grad({residual});
  const char* name = residual.defined() ? "BatchNormAddReluBackward"
                     : relu             ? "BatchNormReluBackward"
                                        : "BatchNormBackward";
  auto backward =
      kernels_backward(x, weight, bias, residual.defined() ? out : Tensor(), residual.defined(),
                       mixed, mean, invstd, training, relu, gx, gw, gb, gr, n, c, hw);
  if (residual.defined()) {
    return autograd::record(out, name, {x, weight, bias, residual}, std::move(backward));
  }
  return autograd::record(out, name, {x, weight, bias}, std::move(backward));
}

// The cuDNN path (forward_cudnn), with f32 per-channel mean and invstd on the device kept for the
// backward, which runs cuDNN's after a training-mode forward that wants the input gradient (its
// saved mean and invstd are the ones our kernels compute); otherwise ours, as cuDNN has no
// eval-mode backward (PyTorch does the same).
Tensor batch_norm_cudnn(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                        const Tensor& weight, const Tensor& bias, bool training, double momentum,
                        double eps, int64_t n, int64_t c, int64_t hw) {
  const bool gx = autograd::needs_grad({x}), gw = autograd::needs_grad({weight});
  const bool gb = autograd::needs_grad({bias});
  Tensor mean = Tensor::empty({c}, DType::f32, x.device());
  Tensor invstd = Tensor::empty({c}, DType::f32, x.device());
  Tensor out = empty_like(x);
  dispatch_on(x.device(), x.dtype(), "batch_norm", [&]<class T, class B>() {
    if constexpr (kOnCuda<B> && kCudnnType<T>) {
      forward_cudnn<T>(x, running_mean, running_var, weight, bias, training, momentum, eps, n, c,
                       hw, out, mean, invstd);
    }
  });
  if (!gx && !gw && !gb) return out;
  if (!training || !gx) {
    auto [mean64, invstd64] =
        training ? std::array<Tensor, 2>{mean.to(DType::f64), invstd.to(DType::f64)}
                 : running_statistics(running_mean, running_var, eps);
    return autograd::record(
        out, "BatchNormBackward", {x, weight, bias},
        kernels_backward(x, weight, bias, Tensor(), false, false, mean64, invstd64, training, false,
                         gx, gw, gb, false, n, c, hw));
  }
  return autograd::record(
      out, "BatchNormBackward", {x, weight, bias},
      [sx = SavedTensor(x), sw = SavedTensor(weight), mean, invstd, eps, gw, gb, n, c,
       hw](const Tensor& grad) -> std::vector<Tensor> {
        const Tensor xv = sx.get(), wv = sw.get();
        auto [dx, dw, db] = gradient_outputs(grad, xv, c, true, gw, gb, grad.dtype());
        dispatch_cuda_float(grad.dtype(), "batch_norm backward", [&]<class T>() {
          if constexpr (kCudnnType<T>) {
            NoGradGuard no_grad;
            const Tensor w32 = f32_param(wv, c, 1.0, grad.device());
            Tensor gw32 = Tensor::empty({c}, DType::f32, grad.device());
            Tensor gb32 = Tensor::empty({c}, DType::f32, grad.device());
            kernels::cuda::cudnn_batch_norm_backward<T>(
                xv.data<T>(), grad.data<T>(), n, c, hw, w32.data<float>(), mean.data<float>(),
                invstd.data<float>(), eps, dx.data<T>(), gw32.data<float>(), gb32.data<float>(),
                cuda_stream(grad));
            if (gw) dw = gw32.to(grad.dtype());
            if (gb) db = gb32.to(grad.dtype());
          }
        });
        return {dx, dw, db};
      });
}

}  // namespace

namespace detail {

std::array<int64_t, 3> check_batch_norm_args(const char* op, const Tensor& x,
                                             const Tensor& running_mean, const Tensor& running_var,
                                             const Tensor& weight, const Tensor& bias, double eps,
                                             bool mixed) {
  check_inputs(op, {x}, Formats::any);
  RG_CHECK(x.dim() == 2 || x.dim() == 4, op,
           ": expected a 2-d [N, C] or 4-d [N, C, H, W] input, got shape ", shape_str(x.shape()));
  int64_t n = x.size(0), c = x.size(1), hw = x.dim() == 4 ? x.size(2) * x.size(3) : 1;
  // Channels last is [N * H * W, C] in memory: the kernels' [n, c, hw] with hw = 1, the same
  // per-channel statistics over the same values.
  if (x.memory_format() == MemoryFormat::channels_last) n *= std::exchange(hw, 1);
  check_channel_tensor(op, running_mean, "running_mean", x, c, mixed);
  check_channel_tensor(op, running_var, "running_var", x, c, mixed);
  check_channel_tensor(op, weight, "weight", x, c, mixed);
  check_channel_tensor(op, bias, "bias", x, c, mixed);
  RG_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
  RG_CHECK(running_mean.defined() == running_var.defined(), op,
           ": running_mean and running_var must both be defined or both undefined");
  RG_CHECK(
      !(running_mean.defined() && (running_mean.requires_grad() || running_var.requires_grad())),
      op, ": running_mean/running_var are statistics updated in place and must not require grad");
  return {n, c, hw};
}

void check_batch_norm_mode(const char* op, const Tensor& x, const Tensor& running_mean,
                           bool training, int64_t count) {
  if (training) {
    RG_CHECK(count > 1, op, ": expected more than 1 value per channel when training, got input ",
             shape_str(x.shape()));
  } else {
    RG_CHECK(running_mean.defined(), op,
             ": running_mean and running_var are required in evaluation mode (training=false)");
  }
}

std::optional<Tensor> batch_norm_through_f32(const Tensor& x, const Tensor& running_mean,
                                             const Tensor& running_var, const Tensor& weight,
                                             const Tensor& bias, bool training,
                                             const BatchNormFn& f32_op) {
  // f16/bf16 activations with f32 parameters and statistics (a BatchNorm2d under autocast, as in
  // PyTorch), and f16/bf16 on the CPU: computed in f32, the result in x's dtype. Statistics that
  // are themselves half are updated in place through f32 copies.
  const auto is_f32 = [](const Tensor& t) { return t.defined() && t.dtype() == DType::f32; };
  const bool mixed = is_half(x.dtype()) && (is_f32(running_mean) || is_f32(weight) || is_f32(bias));
  if (!mixed && !cpu_half_inputs({x, running_mean, running_var, weight, bias})) return std::nullopt;
  const Tensor rm = half_to_f32(running_mean), rv = half_to_f32(running_var);
  Tensor out = f32_op(half_to_f32(x), rm, rv, half_to_f32(weight), half_to_f32(bias)).to(x.dtype());
  if (training && rm.defined() && !rm.is_same(running_mean)) {
    const NoGradGuard no_grad;
    Tensor(running_mean).copy_(rm);
    Tensor(running_var).copy_(rv);
  }
  return out;
}

}  // namespace detail

void count_batch_(const Tensor& num_batches_tracked) {
  const Tensor& t = num_batches_tracked;
  RG_CHECK(t.defined() && t.dtype() == DType::i64 && t.numel() == 1,
           "count_batch_: expected a one-element i64 counter, got ",
           t.defined() ? dtype_name(t.dtype()) + std::string(" ") + shape_str(t.shape())
                       : std::string("an undefined tensor"));
  if (t.device().is_cuda()) {
    const cuda::OpSpan span("batch_norm_count", "op", t.device());
    kernels::BatchNorm<kernels::Cuda>::count_batch(t.data<int64_t>(), kernel_ctx(t));
  } else {
    kernels::BatchNorm<kernels::Cpu>::count_batch(t.data<int64_t>(), kernel_ctx(t));
  }
  t.bump_version();
}

namespace {

// batch_norm, batch_norm_relu (relu) and batch_norm_add_relu (relu, residual defined): the
// checks; the f32 route (batch_norm_through_f32) unless our CUDA kernels take the mixed dtypes as
// they are (cuda_mixed); then cuDNN (the plain op, where it applies) or our kernels.
Tensor batch_norm_op(const char* op, const Tensor& x, const Tensor& residual,
                     const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                     const Tensor& bias, bool training, bool relu, double momentum, double eps) {
  if (residual.defined()) {
    check_inputs(op, {x, residual}, Formats::any);
    RG_CHECK(residual.shape() == x.shape(), op, ": the residual's shape ",
             shape_str(residual.shape()), " differs from the input's ", shape_str(x.shape()));
    if (residual.memory_format() != x.memory_format()) {  // added elementwise: in x's layout
      return batch_norm_op(op, x, residual.contiguous(x.memory_format()), running_mean, running_var,
                           weight, bias, training, relu, momentum, eps);
    }
  } else {
    check_inputs(op, {x}, Formats::any);
  }
  const bool mixed = cuda_mixed(x, {running_mean, running_var, weight, bias});
  if (!mixed) {
    if (auto out = detail::batch_norm_through_f32(
            x, running_mean, running_var, weight, bias, training,
            [&](const Tensor& x32, const Tensor& rm, const Tensor& rv, const Tensor& w,
                const Tensor& b) {
              return batch_norm_op(op, x32, half_to_f32(residual), rm, rv, w, b, training, relu,
                                   momentum, eps);
            })) {
      return *out;
    }
  }
  const auto [n, c, hw] =
      detail::check_batch_norm_args(op, x, running_mean, running_var, weight, bias, eps, mixed);
  detail::check_batch_norm_mode(op, x, running_mean, training, n * hw);
  if (!relu && !residual.defined() && !mixed && x.device().is_cuda() &&
      use_cudnn(x.dtype(), n, c, hw, eps, training)) {
    return batch_norm_cudnn(x, running_mean, running_var, weight, bias, training, momentum, eps, n,
                            c, hw);
  }
  return batch_norm_kernels(op, x, running_mean, running_var, weight, bias, residual, training,
                            relu, mixed, momentum, eps, n, c, hw);
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum,
                  double eps) {
  return batch_norm_op("batch_norm", x, Tensor(), running_mean, running_var, weight, bias, training,
                       false, momentum, eps);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum,
                       double eps) {
  return batch_norm_op("batch_norm_relu", x, Tensor(), running_mean, running_var, weight, bias,
                       training, true, momentum, eps);
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                           bool training, double momentum, double eps) {
  return batch_norm_op("batch_norm_add_relu", x, residual, running_mean, running_var, weight, bias,
                       training, true, momentum, eps);
}

}  // namespace rg
