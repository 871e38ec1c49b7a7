// The loss kernels, one contract for both backends (kernels/backend.h): softmax and log_softmax
// over one dimension of an array viewed as (outer, c, inner), forward and backward, the
// class-index losses nll_loss and cross_entropy (with label smoothing) on [n, c] rows, mean over
// the batch as engine/ops/loss.h, and the regression losses mse_loss and smooth_l1_loss.
// kernels/cpu/loss.cpp defines Loss<Cpu> (f32, f64) and kernels/cuda/loss.cu Loss<Cuda> (f32, f64,
// f16, bf16); every pointer is on the backend's device.
//
// Shared rules:
//   - Row math (max, sum of exponentials, logsumexp) is in the compute type: f64 for f64, f32
//     otherwise. The mean over rows adds per-row losses in f64, in a fixed order, so a loss does
//     not depend on the thread count or timing; the mean of 0 rows is NaN (0 / 0), as PyTorch's.
//   - Targets are not trusted: a target outside [0, c) is never read through. Its row's loss is
//     NaN, and first_bad (two i64) receives the smallest such row and its target, or n and 0 when
//     every target is in range; the caller turns that into an error (engine/ops/loss.cpp does, on
//     both devices). The value travels with the row so that an error read later (a deferred
//     check, a CUDA graph replay whose input buffer holds a newer batch by then) still quotes it.
//   - A backward's loss gradient is the one-element `grad_loss` on the device, so no host
//     synchronization is needed.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

template <class B>
struct Loss {
  // out = x - max - log(sum over c of exp(x - max))
  template <class T>
  static void log_softmax(const T* x, T* out, int64_t outer, int64_t c, int64_t inner, Ctx ctx);
  // grad_in = grad - exp(out) * sum over c of grad, from the forward's output.
  template <class T>
  static void log_softmax_backward(const T* grad, const T* out, T* grad_in, int64_t outer,
                                   int64_t c, int64_t inner, Ctx ctx);
  // out = exp(x - max) / sum over c of exp(x - max)
  template <class T>
  static void softmax(const T* x, T* out, int64_t outer, int64_t c, int64_t inner, Ctx ctx);
  // grad_in = out * (grad - sum over c of grad * out), from the forward's output.
  template <class T>
  static void softmax_backward(const T* grad, const T* out, T* grad_in, int64_t outer, int64_t c,
                               int64_t inner, Ctx ctx);

  // loss[0] = -mean_i log_probs[i, target[i]]; first_bad[0..1] as above.
  template <class T>
  static void nll_loss(const T* log_probs, const int64_t* target, T* loss, int64_t* first_bad,
                       int64_t n, int64_t c, Ctx ctx);
  // grad_in[i, j] = (j == target[i]) ? -grad_loss[0] / n : 0
  template <class T>
  static void nll_loss_backward(const int64_t* target, const T* grad_loss, T* grad_in, int64_t n,
                                int64_t c, Ctx ctx);

  // Scratch bytes cross_entropy needs for n rows (the per-row losses, in f64).
  static int64_t cross_entropy_workspace_bytes(int64_t n) {
    return (n > 0 ? n : 1) * static_cast<int64_t>(sizeof(double));
  }
  // loss[0] = mean_i of (1 - eps) * (lse_i - x[i, target[i]]) + eps * (lse_i - mean_j x[i, j]),
  // with lse_i = logsumexp_j x[i, j] written to lse[i] for the backward (eps = label_smoothing in
  // [0, 1]); first_bad[0..1] as above.
  template <class T>
  static void cross_entropy(const T* logits, const int64_t* target, T* lse, T* loss,
                            int64_t* first_bad, int64_t n, int64_t c, double label_smoothing,
                            Workspace workspace, Ctx ctx);
  // grad_in[i, j] = grad_loss[0] / n * (softmax(x)[i, j] - (1 - eps) * (j == target[i]) - eps / c)
  template <class T>
  static void cross_entropy_backward(const T* logits, const int64_t* target, const T* lse,
                                     const T* grad_loss, T* grad_in, int64_t n, int64_t c,
                                     double label_smoothing, Ctx ctx);

  // Blocks of partial sums mse_loss adds (a fixed number, so the sum's order depends on n only).
  static constexpr int64_t kMseBlocks = 64;
  // Scratch bytes mse_loss needs (the f64 partial sums).
  static int64_t mse_loss_workspace_bytes(int64_t) {
    return kMseBlocks * static_cast<int64_t>(sizeof(double));
  }
  // loss[0] = mean_i (x[i] - y[i])^2 over n values: squares summed in f64 over kMseBlocks
  // contiguous chunks, then the chunks in order (NaN when n == 0, as PyTorch's mean).
  template <class T>
  static void mse_loss(const T* x, const T* y, T* loss, int64_t n, Workspace workspace, Ctx ctx);
  // gx[i] = 2 * (x[i] - y[i]) * grad_loss[0] / n and gy[i] = -gx[i]; either may be null.
  template <class T>
  static void mse_loss_backward(const T* x, const T* y, const T* grad_loss, T* gx, T* gy,
                                int64_t n, Ctx ctx);

  // Scratch bytes smooth_l1_loss needs (the same f64 partial sums as mse_loss).
  static int64_t smooth_l1_loss_workspace_bytes(int64_t n) { return mse_loss_workspace_bytes(n); }
  // loss[0] = mean_i l(x[i] - y[i]) with l(d) = 0.5 d^2 / beta where |d| < beta, else
  // |d| - 0.5 beta (beta >= 0; beta == 0 is the L1 loss); each l(d) in f64, summed over kMseBlocks
  // contiguous chunks as mse_loss (NaN when n == 0).
  template <class T>
  static void smooth_l1_loss(const T* x, const T* y, T* loss, int64_t n, double beta,
                             Workspace workspace, Ctx ctx);
  // gx[i] = l'(x[i] - y[i]) * grad_loss[0] / n with l'(d) = d / beta where |d| < beta, else
  // sign(d) (0 at d == 0), and gy[i] = -gx[i]; either may be null.
  template <class T>
  static void smooth_l1_loss_backward(const T* x, const T* y, const T* grad_loss, T* gx, T* gy,
                                      int64_t n, double beta, Ctx ctx);
};

namespace detail {

// The size checks both backends make before touching memory.
inline void check_softmax_sizes(const char* op, int64_t outer, int64_t c, int64_t inner) {
  RG_CHECK(outer >= 0 && c >= 0 && inner >= 0, op, ": sizes must be non-negative, got outer ",
           outer, ", c ", c, ", inner ", inner);
}
inline void check_loss_rows(const char* op, int64_t n, int64_t c) {
  RG_CHECK(n >= 0 && c > 0, op, ": needs n >= 0 rows of c > 0 classes, got n ", n, ", c ", c);
}
inline void check_smooth_l1_beta(const char* op, int64_t n, double beta) {
  RG_CHECK(n >= 0, op, ": n must be non-negative, got ", n);
  RG_CHECK(beta >= 0.0, op, ": beta must be >= 0, got ", beta);
}
inline void check_label_smoothing(const char* op, double label_smoothing) {
  RG_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
           ": label_smoothing must be in [0, 1], got ", label_smoothing);
}
// A workspace smaller than the kernel's *_workspace_bytes is its caller's bug.
inline void check_workspace(const char* op, Workspace ws, int64_t needed) {
  RG_ASSERT(ws.data != nullptr && ws.bytes >= needed, op, ": needs a workspace of ", needed,
            " bytes, got ", ws.data == nullptr ? int64_t(0) : ws.bytes);
}

}  // namespace detail
}  // namespace rg::kernels
