// The emulated cuDNN subset of kernels/emu/shim/cudnn.h on kernels/cpu/conv2d.
#include "kernels/emu/shim/cudnn.h"

#include <cstdint>
#include <vector>

#include "kernels/cpu/cast.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/error.h"
#include "kernels/half.h"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};
struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
};
struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int k = 0, c = 0, h = 0, w = 0;
};
struct cudnnConvolutionStruct {
  bool set = false;
  int ph = 0, pw = 0, sh = 1, sw = 1, dh = 1, dw = 1;
};

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  *handle = new cudnnContext;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}
const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED:
      return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED";
  }
  return "CUDNN_STATUS_UNKNOWN";
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc) {
  *desc = new cudnnTensorStruct;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc) {
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  if (format != CUDNN_TENSOR_NCHW) return CUDNN_STATUS_NOT_SUPPORTED;
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
  *desc = {true, type, n, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc) {
  *desc = new cudnnFilterStruct;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc) {
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  if (format != CUDNN_TENSOR_NCHW) return CUDNN_STATUS_NOT_SUPPORTED;
  if (k <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
  *desc = {true, type, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* desc) {
  *desc = new cudnnConvolutionStruct;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc) {
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h,
                                              int pad_w, int u, int v, int dilation_h,
                                              int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t) {
  if (mode != CUDNN_CROSS_CORRELATION) return CUDNN_STATUS_NOT_SUPPORTED;
  if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  *desc = {true, pad_h, pad_w, u, v, dilation_h, dilation_w};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, cudnnMathType_t) {
  return desc == nullptr ? CUDNN_STATUS_BAD_PARAM : CUDNN_STATUS_SUCCESS;
}

namespace {

using rg::kernels::cpu::Conv2dGeometry;

// The geometry the descriptors describe, checked as cuDNN does: one data type, matching channel
// counts and batch, and y's spatial size the convolution's.
bool geometry(cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
              cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y, Conv2dGeometry& g) {
  if (x == nullptr || w == nullptr || conv == nullptr || y == nullptr) return false;
  if (!x->set || !w->set || !conv->set || !y->set) return false;
  if (x->type != w->type || x->type != y->type) return false;
  g = Conv2dGeometry{x->n,     x->c,     x->h,     x->w,     w->k,     w->h, w->w, conv->sh,
                     conv->sw, conv->ph, conv->pw, conv->dh, conv->dw, 0,    0};
  const int64_t extent_h = g.dh * (g.kh - 1) + 1, extent_w = g.dw * (g.kw - 1) + 1;
  if (g.h + 2 * g.ph < extent_h || g.w + 2 * g.pw < extent_w) return false;
  g.ho = (g.h + 2 * g.ph - extent_h) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - extent_w) / g.sw + 1;
  return w->c == x->c && y->n == x->n && y->c == w->k && y->h == g.ho && y->w == g.wo;
}

template <class Perf>
cudnnStatus_t one_algorithm(int requested, int* returned, Perf* perf) {
  if (requested < 1) return CUDNN_STATUS_BAD_PARAM;
  perf[0] = Perf{};
  perf[0].status = CUDNN_STATUS_SUCCESS;
  perf[0].memory = 0;
  perf[0].determinism = CUDNN_DETERMINISTIC;
  *returned = 1;
  return CUDNN_STATUS_SUCCESS;
}

bool unit_scales(cudnnDataType_t type, const void* alpha, const void* beta) {
  if (type == CUDNN_DATA_DOUBLE) {
    return *static_cast<const double*>(alpha) == 1.0 && *static_cast<const double*>(beta) == 0.0;
  }
  return *static_cast<const float*>(alpha) == 1.f && *static_cast<const float*>(beta) == 0.f;
}

enum class Pass { forward, data, weight };

// Runs one pass in the compute type C on operands of storage type T: the half types are widened
// to f32 and the result rounded once.
template <class T, class C>
void run(Pass pass, const Conv2dGeometry& g, const void* a, const void* b, void* out) {
  namespace cpu = rg::kernels::cpu;
  const int64_t nx = g.n * g.c * g.h * g.w, nw = g.o * g.c * g.kh * g.kw,
                ny = g.n * g.o * g.ho * g.wo;
  // (a, b) = (x, w) forward, (w, gy) data, (x, gy) weight.
  const int64_t na = pass == Pass::data ? nw : nx, nb = pass == Pass::forward ? nw : ny;
  const int64_t nout = pass == Pass::forward ? ny : pass == Pass::data ? nx : nw;
  auto widen = [](const void* p, int64_t n) {
    std::vector<C> v(static_cast<size_t>(n));
    cpu::cast<T, C>(static_cast<const T*>(p), v.data(), n);
    return v;
  };
  const std::vector<C> av = widen(a, na), bv = widen(b, nb);
  std::vector<C> o(static_cast<size_t>(nout));
  switch (pass) {
    case Pass::forward:
      cpu::conv2d_forward<C>(g, av.data(), bv.data(), nullptr, o.data());
      break;
    case Pass::data:
      cpu::conv2d_backward<C>(g, nullptr, av.data(), bv.data(), o.data(), nullptr, nullptr);
      break;
    case Pass::weight:
      cpu::conv2d_backward<C>(g, av.data(), nullptr, bv.data(), nullptr, o.data(), nullptr);
      break;
  }
  cpu::cast<C, T>(o.data(), static_cast<T*>(out), nout);
}

// Queues the pass on the handle's stream (the geometry is copied: the caller may destroy its
// descriptors as soon as the call returns, as cuDNN allows).
cudnnStatus_t dispatch(cudnnHandle_t handle, cudnnDataType_t type, Pass pass,
                       const Conv2dGeometry& g, const void* a, const void* b, void* out) {
  void (*run_pass)(Pass, const Conv2dGeometry&, const void*, const void*, void*) = nullptr;
  size_t elem = 0;
  switch (type) {
    case CUDNN_DATA_FLOAT:
      run_pass = run<float, float>;
      elem = 4;
      break;
    case CUDNN_DATA_DOUBLE:
      run_pass = run<double, double>;
      elem = 8;
      break;
    case CUDNN_DATA_HALF:
      run_pass = run<rg::Half, float>;
      elem = 2;
      break;
    case CUDNN_DATA_BFLOAT16:
      run_pass = run<rg::BFloat16, float>;
      elem = 2;
      break;
    default:
      return CUDNN_STATUS_NOT_SUPPORTED;
  }
  const size_t nx = size_t(g.n * g.c * g.h * g.w) * elem, nw = size_t(g.o * g.c * g.kh * g.kw) * elem,
               ny = size_t(g.n * g.o * g.ho * g.wo) * elem;
  const size_t na = pass == Pass::data ? nw : nx, nb = pass == Pass::forward ? nw : ny;
  const size_t nout = pass == Pass::forward ? ny : pass == Pass::data ? nx : nw;
  const char* name = pass == Pass::forward ? "cudnnConvolutionForward"
                     : pass == Pass::data  ? "cudnnConvolutionBackwardData"
                                           : "cudnnConvolutionBackwardFilter";
  rg::emu::enqueue(handle->stream, name, {{a, na, false}, {b, nb, false}, {out, nout, true}},
                   [=] { run_pass(pass, g, a, b, out); });
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y, int requested, int* returned,
    cudnnConvolutionFwdAlgoPerf_t* perf) {
  Conv2dGeometry g;
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (!geometry(x, w, conv, y, g)) return CUDNN_STATUS_BAD_PARAM;
  return one_algorithm(requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dx, int requested, int* returned,
    cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  Conv2dGeometry g;
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (!geometry(dx, w, conv, dy, g)) return CUDNN_STATUS_BAD_PARAM;
  return one_algorithm(requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dw, int requested, int* returned,
    cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  Conv2dGeometry g;
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (!geometry(x, dw, conv, dy, g)) return CUDNN_STATUS_BAD_PARAM;
  return one_algorithm(requested, returned, perf);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                      cudnnTensorDescriptor_t x_desc, const void* x,
                                      cudnnFilterDescriptor_t w_desc, const void* w,
                                      cudnnConvolutionDescriptor_t conv, cudnnConvolutionFwdAlgo_t,
                                      void*, size_t, const void* beta,
                                      cudnnTensorDescriptor_t y_desc, void* y) {
  Conv2dGeometry g;
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (!geometry(x_desc, w_desc, conv, y_desc, g)) return CUDNN_STATUS_BAD_PARAM;
  if (!unit_scales(x_desc->type, alpha, beta)) return CUDNN_STATUS_NOT_SUPPORTED;
  return dispatch(handle, x_desc->type, Pass::forward, g, x, w, y);
}
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                           cudnnFilterDescriptor_t w_desc, const void* w,
                                           cudnnTensorDescriptor_t dy_desc, const void* dy,
                                           cudnnConvolutionDescriptor_t conv,
                                           cudnnConvolutionBwdDataAlgo_t, void*, size_t,
                                           const void* beta, cudnnTensorDescriptor_t dx_desc,
                                           void* dx) {
  Conv2dGeometry g;
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (!geometry(dx_desc, w_desc, conv, dy_desc, g)) return CUDNN_STATUS_BAD_PARAM;
  if (!unit_scales(dx_desc->type, alpha, beta)) return CUDNN_STATUS_NOT_SUPPORTED;
  return dispatch(handle, dx_desc->type, Pass::data, g, w, dy, dx);
}
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             cudnnTensorDescriptor_t x_desc, const void* x,
                                             cudnnTensorDescriptor_t dy_desc, const void* dy,
                                             cudnnConvolutionDescriptor_t conv,
                                             cudnnConvolutionBwdFilterAlgo_t, void*, size_t,
                                             const void* beta, cudnnFilterDescriptor_t dw_desc,
                                             void* dw) {
  Conv2dGeometry g;
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (!geometry(x_desc, dw_desc, conv, dy_desc, g)) return CUDNN_STATUS_BAD_PARAM;
  if (!unit_scales(x_desc->type, alpha, beta)) return CUDNN_STATUS_NOT_SUPPORTED;
  return dispatch(handle, x_desc->type, Pass::weight, g, x, dy, dw);
}

namespace rg::emu {
void check_status(cudnnStatus_t status, const char* call, const char* file, int line) {
  RG_CHECK(status == CUDNN_STATUS_SUCCESS, file, ":", line, ": ", call,
           " failed: ", cudnnGetErrorString(status));
}
}  // namespace rg::emu
