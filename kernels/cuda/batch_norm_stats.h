// CUDA batch-norm pieces on device arrays viewed as [n, c, hw] (hw = 1 for [N, C] inputs),
// mirroring kernels/cpu/batch_norm.h: per-channel statistics, normalize + affine, the running-stat
// update and the backward (per-channel sums, then gx). Plain C++ header: `stream` is a
// cudaStream_t.
#pragma once

#include <cstdint>

namespace rg::kernels::cuda {

// Instantiated for float, Half and BFloat16; everything computes in f32 and the per-channel
// statistics are f32 device arrays (the CPU keeps them in double). One block per channel, with a
// fixed reduction tree, so results are deterministic.

// mean[ch] and the biased variance var[ch] over the n * hw values of each channel (two passes:
// the variance sums squares around the mean); invstd[ch] = 1 / sqrt(var[ch] + eps) unless invstd
// is null.
template <class T>
void batch_norm_stats(const T* x, int64_t n, int64_t c, int64_t hw, float* mean, float* var,
                      float* invstd, double eps, void* stream);

// y = (x - mean) * invstd * weight + bias; weight/bias may be null (1 and 0).
template <class T>
void batch_norm_apply(const T* x, int64_t n, int64_t c, int64_t hw, const float* mean,
                      const float* invstd, const T* weight, const T* bias, T* y, void* stream);

// running = (1 - momentum) * running + momentum * batch, with the unbiased batch variance
// var * count / (count - 1) for running_var (PyTorch's formula); either may be null.
template <class T>
void batch_norm_update_running(T* running_mean, T* running_var, const float* mean, const float* var,
                               int64_t c, int64_t count, double momentum, void* stream);

// From gy: gx (null: not wanted), gweight and gbias (null: not wanted). With batch statistics
// (training) gx = weight * invstd / m * (m * gy - sum(gy) - xhat * sum(gy * xhat)) over the
// m = n * hw values of a channel; with running statistics gx = gy * weight * invstd.
template <class T>
void batch_norm_backward(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                         const float* mean, const float* invstd, const T* weight, bool batch_stats,
                         T* gx, T* gweight, T* gbias, void* stream);

}  // namespace rg::kernels::cuda
