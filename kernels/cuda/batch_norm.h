// CUDA batch-norm pieces on device arrays viewed as [n, c, hw] (hw = 1 for [N, C] inputs),
// mirroring kernels/cpu/batch_norm.h: per-channel statistics, normalize + affine, the running-stat
// update and the backward (per-channel sums, then gx); and the same through cuDNN
// (batch_norm_cudnn.cu). Plain C++ header: `stream` is a cudaStream_t.
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

// cuDNN's spatial batch norm (cudnn_ops.h's cudnnBatchNormalization*, the legacy API: the graph
// API runs batch norm only on runtime-fusion engines). Instantiated for float and Half, whose
// parameters (weight, bias, running and saved statistics) cuDNN takes in f32. Results match the
// kernels above: the batch's biased variance normalizes, running_var takes the unbiased one
// (apache/mxnet#21111 and NervanaSystems/ngraph#893 measured cuDNN's), save_mean / save_invstd
// are the mean and invstd that batch_norm_stats computes (cuDNN's "inverse variance" is
// 1 / sqrt(var + eps): microsoft/onnxruntime#8172).

// Whether cuDNN takes a batch norm of this size and eps: non-empty, eps >= CUDNN_BN_MIN_EPSILON,
// sizes within int, and the batch sizes PyTorch found cuDNN's spatial kernels to handle (at most
// 880801 samples training, 65535 inference; PyTorch pull request 32763).
bool cudnn_batch_norm_supported(int64_t n, int64_t c, int64_t hw, double eps, bool training);

// Training: y from the batch statistics; running_mean/var (both or neither null) updated with
// momentum as cuDNN's exponentialAverageFactor; save_mean/save_invstd written for the backward.
template <class T>
void cudnn_batch_norm_forward_training(const T* x, int64_t n, int64_t c, int64_t hw,
                                       const float* weight, const float* bias, double momentum,
                                       float* running_mean, float* running_var, double eps, T* y,
                                       float* save_mean, float* save_invstd, void* stream);
// Inference: y from running_mean/var.
template <class T>
void cudnn_batch_norm_forward_inference(const T* x, int64_t n, int64_t c, int64_t hw,
                                        const float* weight, const float* bias,
                                        const float* running_mean, const float* running_var,
                                        double eps, T* y, void* stream);
// The training-mode backward (cuDNN has no inference one) from the forward's save_mean and
// save_invstd: gx, gweight and gbias, all three written.
template <class T>
void cudnn_batch_norm_backward(const T* x, const T* gy, int64_t n, int64_t c, int64_t hw,
                               const float* weight, const float* save_mean,
                               const float* save_invstd, double eps, T* gx, float* gweight,
                               float* gbias, void* stream);

}  // namespace rg::kernels::cuda
