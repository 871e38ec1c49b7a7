// log_softmax, nll_loss and cross_entropy through kernels::cpu::softmax. cross_entropy keeps only
// the per-row logsumexp for its backward and recomputes softmax there: (softmax - smoothed
// one-hot) / N, without materializing log_softmax.
#include "engine/ops/loss.h"

#include <algorithm>

#include "engine/autograd/function.h"
#include "engine/dispatch.h"
#include "engine/ops/check.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/softmax_loss.h"
#include "kernels/error.h"

namespace rg {

using autograd::SavedTensor;

namespace {

// input [N, C] and target i64 [N] with every class index in [0, C).
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
  if (input.device().is_cuda()) return;  // the kernels give an out-of-range target's row NaN
  const int64_t classes = input.size(1);
  const int64_t* t = target.data<int64_t>();
  for (int64_t i = 0; i < target.numel(); ++i) {
    RG_CHECK(t[i] >= 0 && t[i] < classes, op, ": target ", t[i], " at index ", i,
             " is out of range for ", classes, " classes");
  }
}

// A 0-d CPU tensor with like's dtype holding `value`.
Tensor scalar_tensor(double value, const Tensor& like) {
  Tensor out = Tensor::empty({}, like.dtype(), Device::cpu());
  dispatch_float(like.dtype(), "loss", [&]<class T>() { out.data<T>()[0] = T(value); });
  return out;
}

}  // namespace

Tensor log_softmax(const Tensor& x, int64_t dim) {
  check_inputs("log_softmax", {x});
  const int64_t n = std::max<int64_t>(x.dim(), 1);  // a 0-d tensor is one class
  RG_CHECK(dim >= -n && dim < n, "log_softmax: dim ", dim, " is out of range for shape ",
           shape_str(x.shape()));
  if (dim < 0) dim += n;
  int64_t outer = 1, inner = 1;
  const int64_t c = x.dim() == 0 ? 1 : x.size(dim);
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_on(x.device(), x.dtype(), "log_softmax", [&]<class T, bool kCuda>() {
    if constexpr (kCuda) {
      kernels::cuda::log_softmax<T>(x.data<T>(), out.data<T>(), outer, c, inner, cuda_stream(x));
    } else {
      kernels::cpu::log_softmax<T>(x.data<T>(), out.data<T>(), outer, c, inner);
    }
  });
  return autograd::record(
      out, "LogSoftmaxBackward", {x}, [so = SavedTensor(out), outer, c, inner](const Tensor& g) {
        const Tensor y = so.get();
        Tensor grad_in = Tensor::empty(y.shape(), y.dtype(), y.device());
        dispatch_on(y.device(), y.dtype(), "log_softmax_backward", [&]<class T, bool kCuda>() {
          if constexpr (kCuda) {
            kernels::cuda::log_softmax_backward<T>(g.data<T>(), y.data<T>(), grad_in.data<T>(),
                                                   outer, c, inner, cuda_stream(y));
          } else {
            kernels::cpu::log_softmax_backward<T>(g.data<T>(), y.data<T>(), grad_in.data<T>(),
                                                  outer, c, inner);
          }
        });
        return std::vector<Tensor>{grad_in};
      });
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target) {
  check_class_targets("nll_loss", log_probs, target);
  const int64_t n = log_probs.size(0), c = log_probs.size(1);
  Tensor out;
  if (log_probs.device().is_cuda()) {
    out = Tensor::empty({}, log_probs.dtype(), log_probs.device());
    dispatch_cuda_float(log_probs.dtype(), "nll_loss", [&]<class T>() {
      kernels::cuda::nll_loss<T>(log_probs.data<T>(), target.data<int64_t>(), out.data<T>(), n, c,
                                 cuda_stream(log_probs));
    });
  } else {
    const double total = dispatch_float(log_probs.dtype(), "nll_loss", [&]<class T>() {
      return kernels::cpu::nll_loss<T>(log_probs.data<T>(), target.data<int64_t>(), n, c);
    });
    out = scalar_tensor(total / double(n), log_probs);
  }
  return autograd::record(
      out, "NllLossBackward", {log_probs},
      [st = SavedTensor(target), shape = log_probs.shape(), n, c](const Tensor& g) {
        Tensor grad_in = Tensor::empty(shape, g.dtype(), g.device());
        if (g.device().is_cuda()) {
          dispatch_cuda_float(g.dtype(), "nll_loss_backward", [&]<class T>() {
            kernels::cuda::nll_loss_backward<T>(st.get().data<int64_t>(), g.data<T>(),
                                                grad_in.data<T>(), n, c, cuda_stream(g));
          });
        } else {
          dispatch_float(g.dtype(), "nll_loss_backward", [&]<class T>() {
            kernels::cpu::nll_loss_backward<T>(st.get().data<int64_t>(), grad_in.data<T>(), n, c,
                                               T(-g.item() / double(n)));
          });
        }
        return std::vector<Tensor>{grad_in};
      });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing) {
  check_class_targets("cross_entropy", logits, target);
  RG_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
           "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  const int64_t n = logits.size(0), c = logits.size(1);
  Tensor lse = Tensor::empty({n}, logits.dtype(), logits.device());
  Tensor out;
  if (logits.device().is_cuda()) {
    out = Tensor::empty({}, logits.dtype(), logits.device());
    const Tensor workspace = Tensor::empty({kernels::cuda::cross_entropy_workspace_bytes(n)},
                                           DType::u8, logits.device());
    dispatch_cuda_float(logits.dtype(), "cross_entropy", [&]<class T>() {
      kernels::cuda::cross_entropy<T>(logits.data<T>(), target.data<int64_t>(), lse.data<T>(),
                                      out.data<T>(), n, c, label_smoothing, workspace.raw_data(),
                                      cuda_stream(logits));
    });
  } else {
    const double total = dispatch_float(logits.dtype(), "cross_entropy", [&]<class T>() {
      return kernels::cpu::cross_entropy<T>(logits.data<T>(), target.data<int64_t>(), lse.data<T>(),
                                            n, c, label_smoothing);
    });
    out = scalar_tensor(total / double(n), logits);
  }
  return autograd::record(
      out, "CrossEntropyBackward", {logits},
      [sx = SavedTensor(logits), st = SavedTensor(target), lse, n, c,
       label_smoothing](const Tensor& g) {
        const Tensor x = sx.get();
        Tensor grad_in = Tensor::empty(x.shape(), x.dtype(), x.device());
        if (x.device().is_cuda()) {
          dispatch_cuda_float(x.dtype(), "cross_entropy_backward", [&]<class T>() {
            kernels::cuda::cross_entropy_backward<T>(x.data<T>(), st.get().data<int64_t>(),
                                                     lse.data<T>(), g.data<T>(), grad_in.data<T>(),
                                                     n, c, label_smoothing, cuda_stream(x));
          });
        } else {
          dispatch_float(x.dtype(), "cross_entropy_backward", [&]<class T>() {
            kernels::cpu::cross_entropy_backward<T>(x.data<T>(), st.get().data<int64_t>(),
                                                    lse.data<T>(), grad_in.data<T>(), n, c,
                                                    label_smoothing, T(g.item() / double(n)));
          });
        }
        return std::vector<Tensor>{grad_in};
      });
}

}  // namespace rg
