// Average pooling through cuDNN's pooling descriptors (cudnnPoolingForward/Backward in
// cudnn_ops.h, the legacy API, which covers NCHW f32/f64/f16 pooling on every architecture), with
// the handles and descriptors of kernels/cuda/cudnn_common.h. Floor mode and padding of at most
// half the kernel make cuDNN's windows ours: none reaches past the padded input, so
// COUNT_INCLUDE_PADDING divides by kh * kw as kernels/pool.h does.
#include <climits>
#include <cstdint>
#include <tuple>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cudnn_common.h"
#include "kernels/cuda/pool_cudnn.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::kernels::cuda {
namespace {

using cudnn::as_int;
using cudnn::data_type;
using cudnn::fits_int;
using cudnn::LockedHandle;
using cudnn::scale_t;
using cudnn::TensorDesc;

constexpr const char* kOp = "cuda::avg_pool2d (cuDNN)";

struct PoolingDesc : cudnn::Descriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor,
                                       cudnnDestroyPoolingDescriptor> {
  PoolingDesc(const Pool2dGeometry& g, bool count_include_pad) {
    // NaN propagation only concerns max pooling; a NaN in a window makes its average NaN anyway.
    RG_CUDA_CHECK(cudnnSetPooling2dDescriptor(
        d,
        count_include_pad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                          : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
        CUDNN_PROPAGATE_NAN, as_int(kOp, "kh", g.kh), as_int(kOp, "kw", g.kw),
        as_int(kOp, "ph", g.ph), as_int(kOp, "pw", g.pw), as_int(kOp, "sh", g.sh),
        as_int(kOp, "sw", g.sw)));
  }
};

// The planes as a batch of one-channel images: x, y (and gx, gy) and the pooling.
template <class T>
struct Descriptors {
  TensorDesc x, y;
  PoolingDesc pool;
  Descriptors(const Pool2dGeometry& g, bool count_include_pad)
      : x(kOp, data_type<T>(), g.planes, 1, g.h, g.w),
        y(kOp, data_type<T>(), g.planes, 1, g.ho, g.wo),
        pool(g, count_include_pad) {}
};

void check_supported(const Pool2dGeometry& g) {
  RG_CHECK(cudnn_pool2d_supported(g), kOp, ": cuDNN does not take ", g.planes, " planes of ", g.h,
           "x", g.w, " with kernel (", g.kh, ", ", g.kw, ") and padding (", g.ph, ", ", g.pw,
           ") (ask cudnn_pool2d_supported first)");
}

}  // namespace

bool cudnn_pool2d_supported(const Pool2dGeometry& g) {
  if (g.planes <= 0 || g.h <= 0 || g.w <= 0 || g.kh <= 0 || g.kw <= 0 || g.sh <= 0 || g.sw <= 0)
    return false;
  if (g.ph < 0 || g.pw < 0 || 2 * g.ph > g.kh || 2 * g.pw > g.kw) return false;
  for (int64_t v : {g.planes, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ho, g.wo}) {
    if (!fits_int(v)) return false;
  }
  return g.h <= INT_MAX / g.w && g.h * g.w < INT_MAX / g.planes;
}

template <class T>
void cudnn_avg_pool2d_forward(const Pool2dGeometry& g, const T* x, T* y, bool count_include_pad,
                              void* stream) {
  check_supported(g);
  const LockedHandle h(stream);
  const Descriptors<T>& d = cudnn::cached<Descriptors<T>>(
      std::tuple{g.planes, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.ho, g.wo,
                 count_include_pad},
      g, count_include_pad);
  const scale_t<T> one = 1, zero = 0;
  RG_CUDA_CHECK(cudnnPoolingForward(h.get(), d.pool.d, &one, d.x.d, x, &zero, d.y.d, y));
}

template <class T>
void cudnn_avg_pool2d_backward(const Pool2dGeometry& g, const T* x, const T* y, const T* gy, T* gx,
                               bool count_include_pad, void* stream) {
  check_supported(g);
  const LockedHandle h(stream);
  const Descriptors<T>& d = cudnn::cached<Descriptors<T>>(
      std::tuple{g.planes, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.ho, g.wo,
                 count_include_pad},
      g, count_include_pad);
  const scale_t<T> one = 1, zero = 0;
  RG_CUDA_CHECK(cudnnPoolingBackward(h.get(), d.pool.d, &one, d.y.d, y, d.y.d, gy, d.x.d, x, &zero,
                                     d.x.d, gx));
}

#define RG_INSTANTIATE_CUDNN_POOL(T)                                                              \
  template void cudnn_avg_pool2d_forward<T>(const Pool2dGeometry&, const T*, T*, bool, void*);    \
  template void cudnn_avg_pool2d_backward<T>(const Pool2dGeometry&, const T*, const T*, const T*, \
                                             T*, bool, void*);
RG_INSTANTIATE_CUDNN_POOL(float)
RG_INSTANTIATE_CUDNN_POOL(double)
RG_INSTANTIATE_CUDNN_POOL(Half)
#undef RG_INSTANTIATE_CUDNN_POOL

}  // namespace rg::kernels::cuda
