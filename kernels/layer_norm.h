// The layer-norm kernels, one contract for both backends (kernels/backend.h), on arrays viewed as
// [rows, d]: each row of d contiguous values is normalized by its own mean and biased variance,
// then scaled and shifted per column (F.layer_norm over the last dimension).
// kernels/cpu/layer_norm.cpp defines LayerNorm<Cpu> (f32, f64), kernels/cuda/layer_norm.cu
// LayerNorm<Cuda> (f32, f64, f16, bf16).
//
// Shared rules: per-row sums accumulate in the statistics type LayerNormStat<T> (f64 for f64, f32
// otherwise, as PyTorch's opmath type), the variance in a second pass around the mean; the
// per-column weight and bias gradients sum over rows in f64, in an order fixed by the shape, so
// results do not depend on the thread count or timing (no atomics).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

template <class T>
using LayerNormStat = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class B>
struct LayerNorm {
  // y[r, j] = (x[r, j] - mean[r]) * rstd[r] * weight[j] + bias[j], with rstd = 1 / sqrt(var + eps)
  // over the biased variance; weight/bias may be null (1 and 0). mean and rstd ([rows]) are kept
  // for the backward.
  template <class T>
  static void forward(const T* x, int64_t rows, int64_t d, const T* weight, const T* bias,
                      double eps, T* y, LayerNormStat<T>* mean, LayerNormStat<T>* rstd, Ctx ctx);
  // Scratch bytes backward needs (CUDA: per-chunk partial sums of the parameter gradients).
  static int64_t backward_workspace_bytes(int64_t rows, int64_t d);
  // From gy, with xhat = (x - mean) * rstd and g = gy * weight:
  //   gx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))   (null: not wanted)
  //   gweight[j] = sum_r gy * xhat, gbias[j] = sum_r gy        (null: not wanted)
  template <class T>
  static void backward(const T* gy, const T* x, int64_t rows, int64_t d,
                       const LayerNormStat<T>* mean, const LayerNormStat<T>* rstd, const T* weight,
                       T* gx, T* gweight, T* gbias, Workspace workspace, Ctx ctx);
};

namespace detail {

inline void check_layer_norm_sizes(const char* op, int64_t rows, int64_t d) {
  RG_CHECK(rows >= 0 && d >= 0, op, ": sizes must be non-negative, got rows ", rows, ", d ", d);
}

}  // namespace detail
}  // namespace rg::kernels
