// Batch norm through cuDNN's spatial batch-norm calls, with the handles and descriptors of
// kernels/cuda/cudnn_common.h. Why the legacy API (cudnnBatchNormalizationForwardTraining /
// ForwardInference / Backward in cudnn_ops.h, deprecated in cuDNN 9 but complete): it takes packed
// NCHW f32 and f16 data (f16 with f32 parameters) on every architecture we build for. The graph
// API has no pre-compiled batch-norm engine: its batch norm runs only on runtime-fusion engines
// (kernels compiled at run time, for recent architectures, documented around NHWC tensors), so it
// cannot promise our NCHW tensors an engine. PyTorch calls the same legacy functions.
#include <climits>
#include <cstdint>
#include <tuple>

#include "kernels/cuda/batch_norm_cudnn.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cudnn_common.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::kernels::cuda {
namespace {

using cudnn::data_type;
using cudnn::fits_int;
using cudnn::LockedHandle;
using cudnn::scale_t;
using cudnn::TensorDesc;

constexpr const char* kOp = "cuda::batch_norm (cuDNN)";

// CUDNN_BATCHNORM_SPATIAL, not _PERSISTENT, which "imposes some limits on the range of values"
// (cudnn_ops.h): results must match the CPU for any input.
constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL;

// The batch sizes PyTorch found cuDNN's spatial batch norm to handle (pytorch#32763).
constexpr int64_t kMaxTrainingBatch = 880801, kMaxInferenceBatch = 65535;

// x (and y, gy, gx) as n x c x hw x 1, and the parameters' 1 x c x 1 x 1 descriptor that cuDNN
// derives from it (f32 for f16 data).
template <class T>
struct Descriptors {
  TensorDesc x;
  cudnn::Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor,
                    cudnnDestroyTensorDescriptor>
      param;
  Descriptors(int64_t n, int64_t c, int64_t hw) : x(kOp, data_type<T>(), n, c, hw, 1) {
    RG_CUDA_CHECK(cudnnDeriveBNTensorDescriptor(param.d, x.d, kMode));
  }
};

void check_supported(int64_t n, int64_t c, int64_t hw, double eps, bool training) {
  RG_CHECK(cudnn_batch_norm_supported(n, c, hw, eps, training), kOp, ": cuDNN does not take [", n,
           ", ", c, ", ", hw, "] with eps ", eps, (training ? " in training" : " in inference"),
           " (ask cudnn_batch_norm_supported first)");
}

}  // namespace

bool cudnn_batch_norm_supported(int64_t n, int64_t c, int64_t hw, double eps, bool training) {
  if (n <= 0 || c <= 0 || hw <= 0 || !(eps >= CUDNN_BN_MIN_EPSILON)) return false;
  if (n > (training ? kMaxTrainingBatch : kMaxInferenceBatch)) return false;
  // Fewer than INT_MAX elements, as PyTorch asks (32-bit indexing in some kernels).
  if (!fits_int(c) || !fits_int(hw) || c > INT_MAX / hw) return false;
  return c * hw < INT_MAX / n;
}

template <class T>
void cudnn_batch_norm_forward_training(const T* x, int64_t n, int64_t c, int64_t hw,
                                       const float* weight, const float* bias, double momentum,
                                       float* running_mean, float* running_var, double eps, T* y,
                                       float* save_mean, float* save_invstd, void* stream) {
  check_supported(n, c, hw, eps, true);
  const LockedHandle h(stream);
  const Descriptors<T>& d = cudnn::cached<Descriptors<T>>(std::tuple{n, c, hw}, n, c, hw);
  const scale_t<T> one = 1, zero = 0;
  RG_CUDA_CHECK(cudnnBatchNormalizationForwardTraining(
      h.get(), kMode, &one, &zero, d.x.d, x, d.x.d, y, d.param.d, weight, bias, momentum,
      running_mean, running_var, eps, save_mean, save_invstd));
}

template <class T>
void cudnn_batch_norm_forward_inference(const T* x, int64_t n, int64_t c, int64_t hw,
                                        const float* weight, const float* bias,
                                        const float* running_mean, const float* running_var,
                                        double eps, T* y, void* stream) {
  check_supported(n, c, hw, eps, false);
  const LockedHandle h(stream);
  const Descriptors<T>& d = cudnn::cached<Descriptors<T>>(std::tuple{n, c, hw}, n, c, hw);
  const scale_t<T> one = 1, zero = 0;
  RG_CUDA_CHECK(cudnnBatchNormalizationForwardInference(h.get(), kMode, &one, &zero, d.x.d, x,
                                                        d.x.d, y, d.param.d, weight, bias,
                                                        running_mean, running_var, eps));
}

template <class T>
void cudnn_batch_norm_backward(const T* x, const T* gy, int64_t n, int64_t c, int64_t hw,
                               const float* weight, const float* save_mean,
                               const float* save_invstd, double eps, T* gx, float* gweight,
                               float* gbias, void* stream) {
  check_supported(n, c, hw, eps, true);
  const LockedHandle h(stream);
  const Descriptors<T>& d = cudnn::cached<Descriptors<T>>(std::tuple{n, c, hw}, n, c, hw);
  const scale_t<T> one = 1, zero = 0;
  RG_CUDA_CHECK(cudnnBatchNormalizationBackward(h.get(), kMode, &one, &zero, &one, &zero, d.x.d, x,
                                                d.x.d, gy, d.x.d, gx, d.param.d, weight, gweight,
                                                gbias, eps, save_mean, save_invstd));
}

#define RG_INSTANTIATE(T)                                                                          \
  template void cudnn_batch_norm_forward_training<T>(const T*, int64_t, int64_t, int64_t,          \
                                                     const float*, const float*, double, float*,   \
                                                     float*, double, T*, float*, float*, void*);   \
  template void cudnn_batch_norm_forward_inference<T>(const T*, int64_t, int64_t, int64_t,         \
                                                      const float*, const float*, const float*,    \
                                                      const float*, double, T*, void*);            \
  template void cudnn_batch_norm_backward<T>(const T*, const T*, int64_t, int64_t, int64_t,        \
                                             const float*, const float*, const float*, double, T*, \
                                             float*, float*, void*);
RG_INSTANTIATE(float)
RG_INSTANTIATE(Half)
#undef RG_INSTANTIATE

}  // namespace rg::kernels::cuda
