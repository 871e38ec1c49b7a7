// CUDA softmax-family kernels on device arrays, mirroring kernels/cpu/softmax.h: softmax and
// log_softmax over one dimension (input viewed as (outer, c, inner); the last dimension is
// inner == 1) forward and backward, and the class-index losses nll_loss and cross entropy with
// label smoothing on [n, c] rows, mean over the batch like engine/ops/loss.h.
// Plain C++ header: `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

namespace rg::kernels::cuda {

// Instantiated for float, double, Half and BFloat16; the half types compute in f32. Targets must
// be in [0, c) (the caller validates them, as on the CPU); an out-of-range target is never read
// through: its row's loss is NaN and its gradient row gets no target term. Loss reductions are
// deterministic (fixed trees, no floating-point atomics).

// out = exp(x - max) / sum over c of exp(x - max)
template <class T>
void softmax(const T* x, T* out, int64_t outer, int64_t c, int64_t inner, void* stream);
// grad_in = out * (grad - sum over c of grad * out), from the forward's output.
template <class T>
void softmax_backward(const T* grad, const T* out, T* grad_in, int64_t outer, int64_t c,
                      int64_t inner, void* stream);
// out = x - max - log(sum over c of exp(x - max))
template <class T>
void log_softmax(const T* x, T* out, int64_t outer, int64_t c, int64_t inner, void* stream);
// grad_in = grad - exp(out) * sum over c of grad, from the forward's output.
template <class T>
void log_softmax_backward(const T* grad, const T* out, T* grad_in, int64_t outer, int64_t c,
                          int64_t inner, void* stream);

// loss[0] = -mean_i log_probs[i, target[i]]   (cpu::nll_loss / n; NaN when n == 0)
template <class T>
void nll_loss(const T* log_probs, const int64_t* target, T* loss, int64_t n, int64_t c,
              void* stream);
// grad_in[i, j] = (j == target[i]) ? -grad_loss[0] / n : 0, with grad_loss the loss's incoming
// gradient (one device element), so no host synchronization is needed.
template <class T>
void nll_loss_backward(const int64_t* target, const T* grad_loss, T* grad_in, int64_t n, int64_t c,
                       void* stream);

// Device scratch bytes cross_entropy needs for n rows (the per-row losses).
int64_t cross_entropy_workspace_bytes(int64_t n);
// loss[0] = mean_i of (1 - eps) * (lse_i - x[i, target[i]]) + eps * (lse_i - mean_j x[i, j])
// (cpu::cross_entropy / n), with lse_i = logsumexp_j x[i, j] written to lse[i] for the backward
// (eps = label_smoothing in [0, 1]).
template <class T>
void cross_entropy(const T* logits, const int64_t* target, T* lse, T* loss, int64_t n, int64_t c,
                   double label_smoothing, void* workspace, void* stream);
// grad_in[i, j] = grad_loss[0] / n * (softmax(x)[i, j] - (1 - eps) * (j == target[i]) - eps / c)
template <class T>
void cross_entropy_backward(const T* logits, const int64_t* target, const T* lse,
                            const T* grad_loss, T* grad_in, int64_t n, int64_t c,
                            double label_smoothing, void* stream);

}  // namespace rg::kernels::cuda
