// Batch normalization on raw arrays viewed as [n, c, hw] (hw = 1 for [N, C] inputs): per-channel
// statistics, normalization, running-stat update and the fused backward. Statistics in double.
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

// mean[ch] and the biased variance var[ch] over the n * hw values of each channel.
template <class T>
void batch_norm_stats(const T* x, int64_t n, int64_t c, int64_t hw, double* mean, double* var);

// y = (x - mean) * invstd * weight + bias; weight/bias may be null (1 and 0).
template <class T>
void batch_norm_apply(const T* x, int64_t n, int64_t c, int64_t hw, const double* mean,
                      const double* invstd, const T* weight, const T* bias, T* y);

// running = (1 - momentum) * running + momentum * batch, with the unbiased batch variance
// var * count / (count - 1) for running_var (PyTorch's formula); either may be null.
template <class T>
void batch_norm_update_running(T* running_mean, T* running_var, const double* mean,
                               const double* var, int64_t c, int64_t count, double momentum);

// From gy: gx (null: not wanted), gweight and gbias (null: not wanted). With batch statistics
// (training) gx = weight * invstd / m * (m * gy - sum(gy) - xhat * sum(gy * xhat)) over the
// m = n * hw values of a channel; with running statistics gx = gy * weight * invstd.
template <class T>
void batch_norm_backward(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                         const double* mean, const double* invstd, const T* weight,
                         bool batch_stats, T* gx, T* gweight, T* gbias);

}  // namespace rg::kernels::cpu
