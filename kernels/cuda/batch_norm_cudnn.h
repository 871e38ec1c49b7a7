// Batch norm through cuDNN (batch_norm_cudnn.cu) on device arrays viewed as [n, c, hw] (hw = 1 for
// [N, C] inputs): a CUDA-only alternative to kernels/batch_norm.h's kernels, with cuDNN's f32
// statistics and parameters. Plain C++ header: `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

namespace rg::kernels::cuda {

// cuDNN's spatial batch norm (cudnn_ops.h's cudnnBatchNormalization*, the legacy API: the graph
// API runs batch norm only on runtime-fusion engines). Instantiated for float and Half, whose
// parameters (weight, bias, running and saved statistics) cuDNN takes in f32. Results match the
// kernels above: the batch's biased variance normalizes, running_var takes the unbiased one
// (apache/mxnet#21111 and NervanaSystems/ngraph#893 measured cuDNN's), save_mean / save_invstd
// are the mean and invstd that BatchNorm<B>::stats computes (in f32) (cuDNN's "inverse variance" is
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
