// softmax, log_softmax, nll_loss and cross_entropy through kernels/loss.h, one call per kernel on
// both devices. cross_entropy keeps only the per-row logsumexp for its backward and recomputes
// softmax there: (softmax - smoothed one-hot) / N, without materializing log_softmax.
#include "engine/ops/loss.h"

#include <algorithm>

#include "engine/autograd/function.h"
#include "engine/device_checks.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/check.h"
#include "kernels/error.h"
#include "kernels/loss.h"

namespace rg {

using autograd::SavedTensor;

namespace {

// input [N, C] and target i64 [N] on input's device. Target values are checked by the kernels.
void check_class_targets(const char* op, const Tensor& input, const Tensor& target) {
  check_inputs(op, {input});
  check_dim(op, input, 2, "[N, C]");
  RG_CHECK(target.defined(), op, ": target is an undefined tensor");
  RG_CHECK(target.dtype() == DType::i64, op,
           ": target must be an i64 tensor of class indices, got ", dtype_name(target.dtype()));
  RG_CHECK(target.device() == input.device(), op, ": target is on ", target.device().str(),
           " but input is on ", input.device().str());
  RG_CHECK(target.dim() == 1 && target.size(0) == input.size(0), op, ": target shape ",
           shape_str(target.shape()), " does not match input shape ", shape_str(input.shape()),
           " (expected [", input.size(0), "])");
  RG_CHECK(input.size(1) > 0, op, ": input ", shape_str(input.shape()), " has no classes");
}

// The kernels' first_bad ({row, target}: two i64 on the loss's device) as an error naming the row
// and its target, the same on both devices. On CUDA this reads the pair back (the loss's stream is
// synchronized once), unless a DeferredChecks scope is open: then the flag is posted there and
// raised later, without a stall.
void check_first_bad(const char* op, const Tensor& first_bad, int64_t rows, int64_t classes) {
  auto describe = [op, classes](int64_t row, int64_t value) {
    return detail::cat(op, ": target ", value, " at index ", row, " is out of range for ", classes,
                       " classes");
  };
  if (DeferredChecks* deferred = DeferredChecks::current();
      deferred && first_bad.device().is_cuda())
    return deferred->post(first_bad, rows, std::move(describe));
  const std::vector<int64_t> got = first_bad.to(Device::cpu()).to_vector<int64_t>();
  if (got[0] < rows) RG_FAIL(describe(got[0], got[1]));
}

// x viewed as (outer, c, inner) around dimension `dim` (negative counts from the end).
struct SoftmaxView {
  int64_t outer = 1, c = 1, inner = 1;
};
SoftmaxView softmax_view(const char* op, const Tensor& x, int64_t dim) {
  const int64_t n = std::max<int64_t>(x.dim(), 1);  // a 0-d tensor is one class
  RG_CHECK(dim >= -n && dim < n, op, ": dim ", dim, " is out of range for shape ",
           shape_str(x.shape()));
  if (dim < 0) dim += n;
  SoftmaxView v;
  v.c = x.dim() == 0 ? 1 : x.size(dim);
  for (int64_t d = 0; d < dim; ++d) v.outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) v.inner *= x.size(d);
  return v;
}

// softmax (log_out false) or log_softmax, with its backward from the output.
Tensor softmax_op(const char* op, const char* backward_name, const Tensor& x, int64_t dim,
                  bool log_out) {
  check_inputs(op, {x});
  const SoftmaxView v = softmax_view(op, x, dim);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_on(x.device(), x.dtype(), op, [&]<class T, class B>() {
    using K = kernels::Loss<B>;
    (log_out ? K::template log_softmax<T> : K::template softmax<T>)(x.data<T>(), out.data<T>(),
                                                                    v.outer, v.c, v.inner,
                                                                    kernel_ctx(x));
  });
  return autograd::record(
      out, backward_name, {x}, [so = SavedTensor(out), v, log_out, op](const Tensor& g) {
        const Tensor y = so.get();
        Tensor grad_in = Tensor::empty(y.shape(), y.dtype(), y.device());
        dispatch_on(y.device(), y.dtype(), op, [&]<class T, class B>() {
          using K = kernels::Loss<B>;
          (log_out ? K::template log_softmax_backward<T>
                   : K::template softmax_backward<T>)(g.data<T>(), y.data<T>(), grad_in.data<T>(),
                                                      v.outer, v.c, v.inner, kernel_ctx(y));
        });
        return std::vector<Tensor>{grad_in};
      });
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  if (auto c = autocast_inputs(AutocastPolicy::f32, {x})) return softmax((*c)[0], dim);
  if (cpu_half_inputs({x})) return softmax(half_to_f32(x), dim).to(x.dtype());
  return softmax_op("softmax", "SoftmaxBackward", x, dim, false);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  if (auto c = autocast_inputs(AutocastPolicy::f32, {x})) return log_softmax((*c)[0], dim);
  if (cpu_half_inputs({x})) return log_softmax(half_to_f32(x), dim).to(x.dtype());
  return softmax_op("log_softmax", "LogSoftmaxBackward", x, dim, true);
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target) {
  if (auto c = autocast_inputs(AutocastPolicy::f32, {log_probs})) return nll_loss((*c)[0], target);
  if (cpu_half_inputs({log_probs}))
    return nll_loss(half_to_f32(log_probs), target).to(log_probs.dtype());
  check_class_targets("nll_loss", log_probs, target);
  const int64_t n = log_probs.size(0), c = log_probs.size(1);
  Tensor out = Tensor::empty({}, log_probs.dtype(), log_probs.device());
  const Tensor first_bad = Tensor::empty({2}, DType::i64, log_probs.device());
  dispatch_on(log_probs.device(), log_probs.dtype(), "nll_loss", [&]<class T, class B>() {
    kernels::Loss<B>::nll_loss(log_probs.data<T>(), target.data<int64_t>(), out.data<T>(),
                               first_bad.data<int64_t>(), n, c, kernel_ctx(log_probs));
  });
  check_first_bad("nll_loss", first_bad, n, c);
  return autograd::record(
      out, "NllLossBackward", {log_probs},
      [st = SavedTensor(target), shape = log_probs.shape(), n, c](const Tensor& g) {
        Tensor grad_in = Tensor::empty(shape, g.dtype(), g.device());
        dispatch_on(g.device(), g.dtype(), "nll_loss_backward", [&]<class T, class B>() {
          kernels::Loss<B>::nll_loss_backward(st.get().data<int64_t>(), g.data<T>(),
                                              grad_in.data<T>(), n, c, kernel_ctx(g));
        });
        return std::vector<Tensor>{grad_in};
      });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing) {
  if (auto c = autocast_inputs(AutocastPolicy::f32, {logits}))
    return cross_entropy((*c)[0], target, label_smoothing);
  if (cpu_half_inputs({logits}))
    return cross_entropy(half_to_f32(logits), target, label_smoothing).to(logits.dtype());
  check_class_targets("cross_entropy", logits, target);
  RG_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
           "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  const int64_t n = logits.size(0), c = logits.size(1);
  Tensor lse = Tensor::empty({n}, logits.dtype(), logits.device());
  Tensor out = Tensor::empty({}, logits.dtype(), logits.device());
  const Tensor first_bad = Tensor::empty({2}, DType::i64, logits.device());
  dispatch_on(logits.device(), logits.dtype(), "cross_entropy", [&]<class T, class B>() {
    using K = kernels::Loss<B>;
    const Tensor ws =
        Tensor::empty({K::cross_entropy_workspace_bytes(n)}, DType::u8, logits.device());
    K::cross_entropy(logits.data<T>(), target.data<int64_t>(), lse.data<T>(), out.data<T>(),
                     first_bad.data<int64_t>(), n, c, label_smoothing,
                     kernels::Workspace{ws.raw_data(), ws.numel()}, kernel_ctx(logits));
  });
  check_first_bad("cross_entropy", first_bad, n, c);
  return autograd::record(
      out, "CrossEntropyBackward", {logits},
      [sx = SavedTensor(logits), st = SavedTensor(target), lse, n, c,
       label_smoothing](const Tensor& g) {
        const Tensor x = sx.get();
        Tensor grad_in = Tensor::empty(x.shape(), x.dtype(), x.device());
        dispatch_on(x.device(), x.dtype(), "cross_entropy_backward", [&]<class T, class B>() {
          kernels::Loss<B>::cross_entropy_backward(x.data<T>(), st.get().data<int64_t>(),
                                                   lse.data<T>(), g.data<T>(), grad_in.data<T>(), n,
                                                   c, label_smoothing, kernel_ctx(x));
        });
        return std::vector<Tensor>{grad_in};
      });
}

Tensor mse_loss(const Tensor& input, const Tensor& target) {
  if (auto c = autocast_inputs(AutocastPolicy::f32, {input, target}))
    return mse_loss((*c)[0], (*c)[1]);
  check_inputs("mse_loss", {input, target});
  RG_CHECK(input.shape() == target.shape(), "mse_loss: input shape ", shape_str(input.shape()),
           " does not match target shape ", shape_str(target.shape()));
  if (cpu_half_inputs({input, target}))
    return mse_loss(half_to_f32(input), half_to_f32(target)).to(input.dtype());
  const Tensor &x = input, &y = target;
  const int64_t n = x.numel();
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  dispatch_on(x.device(), x.dtype(), "mse_loss", [&]<class T, class B>() {
    using K = kernels::Loss<B>;
    const Tensor ws = Tensor::empty({K::mse_loss_workspace_bytes(n)}, DType::u8, x.device());
    K::mse_loss(x.data<T>(), y.data<T>(), out.data<T>(), n,
                kernels::Workspace{ws.raw_data(), ws.numel()}, kernel_ctx(x));
  });
  const bool gx = autograd::needs_grad({input}), gy = autograd::needs_grad({target});
  return autograd::record(
      out, "MseLossBackward", {input, target},
      [sx = SavedTensor(x), sy = SavedTensor(y), n, gx, gy](const Tensor& g) {
        const Tensor xv = sx.get(), yv = sy.get();
        Tensor dx = gx ? Tensor::empty(xv.shape(), xv.dtype(), xv.device()) : Tensor();
        Tensor dy = gy ? Tensor::empty(yv.shape(), yv.dtype(), yv.device()) : Tensor();
        dispatch_on(xv.device(), xv.dtype(), "mse_loss_backward", [&]<class T, class B>() {
          kernels::Loss<B>::mse_loss_backward(xv.data<T>(), yv.data<T>(), g.data<T>(),
                                              gx ? dx.data<T>() : nullptr,
                                              gy ? dy.data<T>() : nullptr, n, kernel_ctx(xv));
        });
        return std::vector<Tensor>{dx, dy};
      });
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, double beta) {
  if (auto c = autocast_inputs(AutocastPolicy::f32, {input, target}))
    return smooth_l1_loss((*c)[0], (*c)[1], beta);
  check_inputs("smooth_l1_loss", {input, target});
  RG_CHECK(input.shape() == target.shape(), "smooth_l1_loss: input shape ",
           shape_str(input.shape()), " does not match target shape ", shape_str(target.shape()));
  RG_CHECK(beta >= 0.0, "smooth_l1_loss: beta must be >= 0, got ", beta);
  if (cpu_half_inputs({input, target}))
    return smooth_l1_loss(half_to_f32(input), half_to_f32(target), beta).to(input.dtype());
  const int64_t n = input.numel();
  Tensor out = Tensor::empty({}, input.dtype(), input.device());
  dispatch_on(input.device(), input.dtype(), "smooth_l1_loss", [&]<class T, class B>() {
    using K = kernels::Loss<B>;
    const Tensor ws =
        Tensor::empty({K::smooth_l1_loss_workspace_bytes(n)}, DType::u8, input.device());
    K::smooth_l1_loss(input.data<T>(), target.data<T>(), out.data<T>(), n, beta,
                      kernels::Workspace{ws.raw_data(), ws.numel()}, kernel_ctx(input));
  });
  const bool gx = autograd::needs_grad({input}), gy = autograd::needs_grad({target});
  return autograd::record(
      out, "SmoothL1LossBackward", {input, target},
      [sx = SavedTensor(input), sy = SavedTensor(target), n, beta, gx, gy](const Tensor& g) {
        const Tensor xv = sx.get(), yv = sy.get();
        Tensor dx = gx ? Tensor::empty(xv.shape(), xv.dtype(), xv.device()) : Tensor();
        Tensor dy = gy ? Tensor::empty(yv.shape(), yv.dtype(), yv.device()) : Tensor();
        dispatch_on(xv.device(), xv.dtype(), "smooth_l1_loss_backward", [&]<class T, class B>() {
          kernels::Loss<B>::smooth_l1_loss_backward(
              xv.data<T>(), yv.data<T>(), g.data<T>(), gx ? dx.data<T>() : nullptr,
              gy ? dy.data<T>() : nullptr, n, beta, kernel_ctx(xv));
        });
        return std::vector<Tensor>{dx, dy};
      });
}

}  // namespace rg
