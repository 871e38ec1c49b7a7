// The batch-norm kernels, one contract for both backends (kernels/backend.h), on arrays viewed as
// [n, c, hw] (hw = 1 for [N, C] inputs): per-channel statistics, normalize + affine, the
// running-statistics update and the backward. kernels/cpu/batch_norm.cpp defines BatchNorm<Cpu>
// (f32, f64), kernels/cuda/batch_norm.cu BatchNorm<Cuda> (f32, f64, f16, bf16); cuDNN's batch
// norm, a CUDA-only alternative with its own f32 statistics, is kernels/cuda/batch_norm_cudnn.h.
//
// P, the parameters' type (weight, bias and their gradients): T, or on CUDA f32 with f16/bf16
// activations (autocast's BatchNorm2d: half activations, f32 parameters and statistics, as
// PyTorch's kernels take them), instantiated for apply and backward; never deduced (pass it).
//
// Shared rules: per-channel sums accumulate in f64 and the statistics (mean, var, invstd) are f64
// arrays on the device, as PyTorch's CPU batch norm keeps them; per-channel coefficients are
// formed in f64 and rounded once to the compute type (f64 for f64, f32 otherwise), in which the
// elementwise parts run. Results do not depend on the thread count or timing.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

template <class B>
struct BatchNorm {
  // Scratch bytes stats and backward need for these sizes (CUDA: per-slice partial sums of a
  // channel and per-channel coefficients; the CPU none). 0 when c is 0.
  static int64_t workspace_bytes(int64_t n, int64_t c, int64_t hw);
  // mean[ch] and the biased variance var[ch] over the n * hw values of each channel, in f64
  // without E[x^2] - E[x]^2 cancellation (the CPU: squares around the mean, in a second pass;
  // CUDA: in one pass, each thread's squares around its own first value, merged with Chan et
  // al.'s pairwise update); invstd[ch] = 1 / sqrt(var[ch] + eps) unless invstd is null.
  template <class T>
  static void stats(const T* x, int64_t n, int64_t c, int64_t hw, double* mean, double* var,
                    double* invstd, double eps, Workspace workspace, Ctx ctx);
  // y = (x - mean) * (invstd * weight) + bias; weight/bias may be null (1 and 0). residual (null:
  // none, else an array like x): then y = y + residual, y rounded to T before the add as an
  // unfused add would see it. relu: then y = y < 0 ? 0 : y (relu's rule: NaN stays NaN). Exactly
  // the unfused batch norm, add and relu.
  template <class T, class P = T>
  static void apply(const T* x, int64_t n, int64_t c, int64_t hw, const double* mean,
                    const double* invstd, const std::type_identity_t<P>* weight,
                    const std::type_identity_t<P>* bias, const T* residual, bool relu, T* y,
                    Ctx ctx);
  // running = (1 - momentum) * running + momentum * batch (in f64), with the unbiased batch
  // variance var * count / (count - 1) for running_var (PyTorch's formula); either may be null.
  template <class T>
  static void update_running(T* running_mean, T* running_var, const double* mean,
                             const double* var, int64_t c, int64_t count, double momentum,
                             Ctx ctx);
  // From gy: gx (null: not wanted), gweight and gbias (null: not wanted). With batch statistics
  // (training) gx = weight * invstd / m * (m * gy - sum(gy) - xhat * sum(gy * xhat)) over the
  // m = n * hw values of a channel; with running statistics gx = gy * weight * invstd.
  // relu: the backward of apply(..., relu = true): gy counts only where apply's output is
  // positive, read from y (that output) when given, else recomputed from x, mean, invstd, weight
  // and bias with apply's arithmetic (an apply without a residual); either way the mask
  // relu_backward would take from the saved output, so this is bit for bit the composition
  // relu_backward then backward. gresidual (null: not wanted): gy where counted, else 0 (the
  // gradient of apply's residual, which the add passes on from relu_backward).
  template <class T, class P = T>
  static void backward(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                       const double* mean, const double* invstd,
                       const std::type_identity_t<P>* weight, const std::type_identity_t<P>* bias,
                       const T* y, bool batch_stats, bool relu, T* gx,
                       std::type_identity_t<P>* gweight, std::type_identity_t<P>* gbias,
                       T* gresidual, Workspace workspace, Ctx ctx);
  // The backward in two halves, for a batch norm whose statistics span several arrays (processes,
  // SyncBatchNorm): this array's per-channel sums[ch] = sum(gy) and sums[c + ch] = sum(gy * xhat)
  // (f64, 2 * c values), which the caller may add up across arrays, ...
  template <class T>
  static void backward_reduce(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                              const double* mean, const double* invstd, double* sums, Ctx ctx);
  // ... then gx from sums over `count` values per channel: backward's training-mode formula with
  // m = count and the given sums in place of this array's.
  template <class T>
  static void backward_elemt(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                             const double* mean, const double* invstd, const T* weight,
                             const double* sums, int64_t count, T* gx, Ctx ctx);
  // *num_batches_tracked += 1 on the kernel's device (BatchNorm2d's counter: on CUDA one tiny
  // kernel, so that counting a batch never reads the counter back to the host).
  static void count_batch(int64_t* num_batches_tracked, Ctx ctx);
};

namespace detail {

inline void check_batch_norm_sizes(const char* op, int64_t n, int64_t c, int64_t hw) {
  RG_CHECK(n >= 0 && c >= 0 && hw >= 0, op, ": sizes must be non-negative, got n ", n, ", c ", c,
           ", hw ", hw);
}

}  // namespace detail
}  // namespace rg::kernels
