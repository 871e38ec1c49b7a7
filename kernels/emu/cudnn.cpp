// The emulated cuDNN subset of kernels/emu/shim/cudnn.h on the CPU kernels: convolution on
// kernels/cpu/conv2d (f32 inputs rounded to TF32 where the math type allows it,
// kernels/emu/tf32.h), batch normalization on kernels/cpu/batch_norm, pooling on kernels/cpu/pool.
// Every call is queued on its handle's stream with the memory it reads and writes declared to the
// race detector. The graph (backend) API is kernels/emu/cudnn_backend.cpp, on the same queued
// convolution (dispatch, kernels/emu/cudnn_internal.h).
#include "kernels/emu/shim/cudnn.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/batch_norm.h"
#include "kernels/conv2d.h"
#include "kernels/cpu/cast.h"
#include "kernels/emu/cudnn_internal.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/emu/tf32.h"
#include "kernels/error.h"
#include "kernels/half.h"
#include "kernels/pool.h"

struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
  bool nhwc = false;  // CUDNN_TENSOR_NHWC: only the convolution takes it
};
struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int k = 0, c = 0, h = 0, w = 0;
  bool nhwc = false;  // KRSC
};
struct cudnnConvolutionStruct {
  bool set = false;
  int ph = 0, pw = 0, sh = 1, sw = 1, dh = 1, dw = 1;
  // cuDNN's default for f32 data on Ampere and later allows TF32; CUDNN_FMA_MATH forbids it.
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};
struct cudnnPoolingStruct {
  bool set = false;
  cudnnPoolingMode_t mode = CUDNN_POOLING_MAX;
  int kh = 0, kw = 0, ph = 0, pw = 0, sh = 1, sw = 1;
};

namespace rg::emu::cudnn_detail {

std::atomic<int> live_descriptors{0};

namespace {
std::mutex calls_mu;
std::map<std::string, int64_t, std::less<>> calls;  // by cuDNN function name
}  // namespace

void count_call(std::string_view name) {
  std::lock_guard<std::mutex> lock(calls_mu);
  const auto it = calls.find(name);
  if (it != calls.end()) {
    ++it->second;
  } else {
    calls.emplace(std::string(name), 1);
  }
}

int64_t calls_of(std::string_view name) {
  std::lock_guard<std::mutex> lock(calls_mu);
  const auto it = calls.find(name);
  return it == calls.end() ? 0 : it->second;
}

void queue(cudnnHandle_t handle, const char* name, std::vector<MemAccess> accesses,
           std::function<void()> work) {
  count_call(name);
  enqueue(handle->stream, name, std::move(accesses), std::move(work));
}

}  // namespace rg::emu::cudnn_detail

namespace {

using rg::emu::cudnn_detail::count_call;
using rg::emu::cudnn_detail::live_descriptors;
using rg::emu::cudnn_detail::queue;

// n values of storage type T at p, widened (or copied) to the compute type C.
template <class T, class C>
std::vector<C> widen(const void* p, int64_t n) {
  std::vector<C> v(static_cast<size_t>(n));
  rg::kernels::cpu::cast<T, C>(static_cast<const T*>(p), v.data(), n);
  return v;
}

template <class D>
cudnnStatus_t create_descriptor(D** desc, const char* function) {
  if (desc == nullptr) return CUDNN_STATUS_BAD_PARAM;
  *desc = new D;
  ++live_descriptors;
  rg::emu::library_object_created(function);
  return CUDNN_STATUS_SUCCESS;
}

template <class D>
cudnnStatus_t destroy_descriptor(D* desc) {
  if (desc != nullptr) --live_descriptors;
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  // cuDNN allocates device memory: a capture on this thread fails.
  if (rg::emu::refuse_during_capture(true)) return CUDNN_STATUS_NOT_INITIALIZED;
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
    case CUDNN_STATUS_EXECUTION_FAILED:
      return "CUDNN_STATUS_EXECUTION_FAILED";
  }
  return "CUDNN_STATUS_UNKNOWN";
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc) {
  count_call("cudnnCreateTensorDescriptor");
  return create_descriptor(desc, "cudnnCreateTensorDescriptor");
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc) {
  return destroy_descriptor(desc);
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC) return CUDNN_STATUS_NOT_SUPPORTED;
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
  *desc = {true, type, n, c, h, w, format == CUDNN_TENSOR_NHWC};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc) {
  count_call("cudnnCreateFilterDescriptor");
  return create_descriptor(desc, "cudnnCreateFilterDescriptor");
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc) {
  return destroy_descriptor(desc);
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC) return CUDNN_STATUS_NOT_SUPPORTED;
  if (k <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
  *desc = {true, type, k, c, h, w, format == CUDNN_TENSOR_NHWC};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* desc) {
  count_call("cudnnCreateConvolutionDescriptor");
  return create_descriptor(desc, "cudnnCreateConvolutionDescriptor");
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc) {
  return destroy_descriptor(desc);
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h,
                                              int pad_w, int u, int v, int dilation_h,
                                              int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t) {
  if (mode != CUDNN_CROSS_CORRELATION) return CUDNN_STATUS_NOT_SUPPORTED;
  if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  *desc = {true, pad_h, pad_w, u, v, dilation_h, dilation_w, desc->math};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, cudnnMathType_t math) {
  if (desc == nullptr) return CUDNN_STATUS_BAD_PARAM;
  if (math != CUDNN_DEFAULT_MATH && math != CUDNN_TENSOR_OP_MATH && math != CUDNN_FMA_MATH) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  desc->math = math;
  return CUDNN_STATUS_SUCCESS;
}

// The convolution pass both APIs queue.
namespace rg::emu::cudnn_detail {
namespace {

using kernels::Conv2dGeometry;
using ConvCpu = kernels::Conv2d<kernels::Cpu>;
using Dims = std::array<int64_t, 4>;

// The values of a packed tensor of dimensions d (NCHW order) moved from NHWC order to NCHW
// (to_nchw) or back, from `in` to `out`.
template <class C>
void relayout(const C* in, C* out, const Dims& d, bool to_nchw) {
  size_t nchw = 0;
  for (int64_t i0 = 0; i0 < d[0]; ++i0) {
    for (int64_t i1 = 0; i1 < d[1]; ++i1) {
      for (int64_t i2 = 0; i2 < d[2]; ++i2) {
        for (int64_t i3 = 0; i3 < d[3]; ++i3, ++nchw) {
          const size_t nhwc = size_t(((i0 * d[2] + i2) * d[3] + i3) * d[1] + i1);
          if (to_nchw) {
            out[nchw] = in[nhwc];
          } else {
            out[nhwc] = in[nchw];
          }
        }
      }
    }
  }
}

// The buffers of the stream worker running a pass, kept from one pass to the next: activations
// are large, and fresh pages for every pass cost more than the convolution.
template <class C>
std::array<std::vector<C>, 4>& scratch_buffers() {
  thread_local std::array<std::vector<C>, 4> buffers;
  return buffers;
}

// n values of buffer `slot`.
template <class C>
C* scratch(int slot, int64_t n) {
  std::vector<C>& v = scratch_buffers<C>()[size_t(slot)];
  if (v.size() < size_t(n)) v.resize(size_t(n));
  return v.data();
}

// After a pass: a buffer over 64 MiB (a large batch's activations) is given back rather than
// kept by the worker for the rest of the process.
template <class C>
void trim_scratch() {
  constexpr size_t kKeepBytes = size_t(64) << 20;
  for (std::vector<C>& v : scratch_buffers<C>()) {
    if (v.capacity() * sizeof(C) > kKeepBytes) std::vector<C>().swap(v);
  }
}

// Runs one pass in the compute type C on operands of storage type T: the half types are widened
// to f32 and the result rounded once; with tf32 both operands are rounded to TF32 first.
template <class T, class C>
void run(const ConvCall& p) {
  // The CPU convolution runs on the operands moved to NCHW here (p.layout), so on NCHW arrays.
  Conv2dGeometry g = p.g;
  g.channels_last = false;
  const Dims x{g.n, g.c, g.h, g.w}, w{g.o, g.c, g.kh, g.kw}, y{g.n, g.o, g.ho, g.wo};
  // (a, b) = (x, w) forward, (w, gy) data, (x, gy) weight.
  const Dims& da = p.pass == Pass::data ? w : x;
  const Dims& db = p.pass == Pass::forward ? w : y;
  const Dims& dout = p.pass == Pass::forward ? y : p.pass == Pass::data ? x : w;
  const auto count = [](const Dims& d) { return d[0] * d[1] * d[2] * d[3]; };
  const bool nhwc = p.layout == Layout::nhwc;
  bool tf32 = false;
  if constexpr (std::is_same_v<T, float>) tf32 = p.tf32;
  const auto pass = [&](const C* a, const C* b, C* out) {
    switch (p.pass) {
      case Pass::forward:
        ConvCpu::forward<C>(g, a, b, nullptr, out, false, {}, {});
        break;
      case Pass::data:
        ConvCpu::backward<C>(g, nullptr, a, b, out, nullptr, nullptr, false, {}, {});
        break;
      case Pass::weight:
        ConvCpu::backward<C>(g, a, nullptr, b, nullptr, out, nullptr, false, {}, {});
        break;
    }
  };
  if constexpr (std::is_same_v<T, C>) {
    if (!nhwc && !tf32) {  // nothing to convert: the device arrays themselves
      pass(static_cast<const C*>(p.a), static_cast<const C*>(p.b), static_cast<C*>(p.out));
      return;
    }
  }
  // An operand in the compute type, NCHW, rounded to TF32 if asked, in buffer `slot`.
  const auto operand = [&](int slot, const void* in, const Dims& d) {
    const int64_t n = count(d);
    C* v = scratch<C>(slot, n);
    if (nhwc) {
      C* t = scratch<C>(3, n);
      kernels::cpu::cast<T, C>(static_cast<const T*>(in), t, n);
      relayout(t, v, d, true);
    } else {
      kernels::cpu::cast<T, C>(static_cast<const T*>(in), v, n);
    }
    if constexpr (std::is_same_v<T, float>) {
      if (tf32) round_to_tf32(v, size_t(n));
    }
    return v;
  };
  const C* av = operand(0, p.a, da);
  const C* bv = operand(1, p.b, db);
  const int64_t nout = count(dout);
  C* o = scratch<C>(2, nout);
  pass(av, bv, o);
  if (nhwc) {
    C* t = scratch<C>(3, nout);
    relayout(o, t, dout, false);
    o = t;
  }
  kernels::cpu::cast<C, T>(o, static_cast<T*>(p.out), nout);
  trim_scratch<C>();
}

}  // namespace

size_t element_bytes(cudnnDataType_t type) {
  switch (type) {
    case CUDNN_DATA_FLOAT:
      return 4;
    case CUDNN_DATA_DOUBLE:
      return 8;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16:
      return 2;
    default:
      return 0;
  }
}

bool complete_geometry(Conv2dGeometry& g) {
  const int64_t extent_h = g.dh * (g.kh - 1) + 1, extent_w = g.dw * (g.kw - 1) + 1;
  if (g.h + 2 * g.ph < extent_h || g.w + 2 * g.pw < extent_w) return false;
  g.ho = (g.h + 2 * g.ph - extent_h) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - extent_w) / g.sw + 1;
  return true;
}

cudnnStatus_t dispatch(cudnnHandle_t handle, const ConvCall& call) {
  void (*run_pass)(const ConvCall&) = nullptr;
  switch (call.type) {
    case CUDNN_DATA_FLOAT:
      run_pass = run<float, float>;
      break;
    case CUDNN_DATA_DOUBLE:
      run_pass = run<double, double>;
      break;
    case CUDNN_DATA_HALF:
      run_pass = run<Half, float>;
      break;
    case CUDNN_DATA_BFLOAT16:
      run_pass = run<BFloat16, float>;
      break;
    default:
      return CUDNN_STATUS_NOT_SUPPORTED;
  }
  const Conv2dGeometry& g = call.g;
  const size_t elem = element_bytes(call.type);
  const size_t nx = size_t(g.n * g.c * g.h * g.w) * elem,
               nw = size_t(g.o * g.c * g.kh * g.kw) * elem,
               ny = size_t(g.n * g.o * g.ho * g.wo) * elem;
  const size_t na = call.pass == Pass::data ? nw : nx, nb = call.pass == Pass::forward ? nw : ny;
  const size_t nout = call.pass == Pass::forward ? ny : call.pass == Pass::data ? nx : nw;
  std::vector<MemAccess> accesses{{call.a, na, false}, {call.b, nb, false}, {call.out, nout, true}};
  if (call.workspace != nullptr && call.workspace_bytes > 0) {
    accesses.push_back({call.workspace, call.workspace_bytes, true});
  }
  queue(handle, call.name, std::move(accesses), [run_pass, call] { run_pass(call); });
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace rg::emu::cudnn_detail

namespace {

using rg::emu::cudnn_detail::ConvCall;
using rg::emu::cudnn_detail::Pass;
using rg::kernels::Conv2dGeometry;

// The geometry the descriptors describe, checked as cuDNN does: one data type, matching channel
// counts and batch, and y's spatial size the convolution's.
bool geometry(cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
              cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y, Conv2dGeometry& g) {
  if (x == nullptr || w == nullptr || conv == nullptr || y == nullptr) return false;
  if (!x->set || !w->set || !conv->set || !y->set) return false;
  if (x->type != w->type || x->type != y->type) return false;
  if (x->nhwc != w->nhwc || x->nhwc != y->nhwc) return false;  // one layout for all three
  g = Conv2dGeometry{x->n,     x->c,     x->h,     x->w,     w->k,     w->h, w->w, conv->sh,
                     conv->sw, conv->ph, conv->pw, conv->dh, conv->dw, 0,    0,    x->nhwc};
  if (!rg::emu::cudnn_detail::complete_geometry(g)) return false;
  return w->c == x->c && y->n == x->n && y->c == w->k && y->h == g.ho && y->w == g.wo;
}

std::atomic<rg::emu::CudnnConvAlgorithms> conv_algorithms{
    rg::emu::CudnnConvAlgorithms::deterministic};

// The algorithms on offer (rg::emu::cudnn_set_conv_algorithms), best first. `deterministic_algo`
// is the pass's deterministic algorithm when only one is offered; `weight_pass`: the offer is for
// the weight gradient.
template <class Perf>
cudnnStatus_t offer_algorithms(int requested, int* returned, Perf* perf, int deterministic_algo,
                               bool weight_pass = false) {
  if (requested < 1 || returned == nullptr || perf == nullptr) return CUDNN_STATUS_BAD_PARAM;
  using Algo = decltype(Perf{}.algo);
  const auto entry = [](int algo, bool deterministic, float ms) {
    Perf p{};
    p.algo = static_cast<Algo>(algo);
    p.status = CUDNN_STATUS_SUCCESS;
    p.time = ms;
    p.memory = 0;
    p.determinism = deterministic ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
    return p;
  };
  std::vector<Perf> offer;
  switch (conv_algorithms.load()) {
    case rg::emu::CudnnConvAlgorithms::deterministic:
      offer = {entry(deterministic_algo, true, 1.f)};
      break;
    case rg::emu::CudnnConvAlgorithms::nondeterministic_first:
      offer = {entry(0, false, 1.f), entry(1, true, 2.f)};
      break;
    case rg::emu::CudnnConvAlgorithms::nondeterministic_only:
      offer = {entry(0, false, 1.f)};
      break;
    case rg::emu::CudnnConvAlgorithms::nondeterministic_only_weight_gradient:
      offer = {weight_pass ? entry(0, false, 1.f) : entry(deterministic_algo, true, 1.f)};
      break;
  }
  const int n = std::min(requested, static_cast<int>(offer.size()));
  for (int i = 0; i < n; ++i) perf[i] = offer[static_cast<size_t>(i)];
  *returned = n;
  return CUDNN_STATUS_SUCCESS;
}

bool unit_scales(cudnnDataType_t type, const void* alpha, const void* beta) {
  if (type == CUDNN_DATA_DOUBLE) {
    return *static_cast<const double*>(alpha) == 1.0 && *static_cast<const double*>(beta) == 0.0;
  }
  return *static_cast<const float*>(alpha) == 1.f && *static_cast<const float*>(beta) == 0.f;
}

// Queues a legacy convolution pass: TF32 for f32 data unless the math type is CUDNN_FMA_MATH
// (or NVIDIA_TF32_OVERRIDE=0).
cudnnStatus_t dispatch(cudnnHandle_t handle, cudnnDataType_t type, cudnnMathType_t math, Pass pass,
                       const Conv2dGeometry& g, const void* a, const void* b, void* out) {
  const char* name = pass == Pass::forward ? "cudnnConvolutionForward"
                     : pass == Pass::data  ? "cudnnConvolutionBackwardData"
                                           : "cudnnConvolutionBackwardFilter";
  const bool tf32 =
      type == CUDNN_DATA_FLOAT && math != CUDNN_FMA_MATH && !rg::emu::tf32_overridden_off();
  return rg::emu::cudnn_detail::dispatch(
      handle, ConvCall{name, type, tf32, pass, g,
                       g.channels_last ? rg::emu::cudnn_detail::Layout::nhwc
                                       : rg::emu::cudnn_detail::Layout::nchw,
                       a, b, out});
}

}  // namespace

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y, int requested, int* returned,
    cudnnConvolutionFwdAlgoPerf_t* perf) {
  Conv2dGeometry g;
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (!geometry(x, w, conv, y, g)) return CUDNN_STATUS_BAD_PARAM;
  return offer_algorithms(requested, returned, perf, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dx, int requested, int* returned,
    cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  Conv2dGeometry g;
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (!geometry(dx, w, conv, dy, g)) return CUDNN_STATUS_BAD_PARAM;
  return offer_algorithms(requested, returned, perf, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dw, int requested, int* returned,
    cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  Conv2dGeometry g;
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (!geometry(x, dw, conv, dy, g)) return CUDNN_STATUS_BAD_PARAM;
  return offer_algorithms(requested, returned, perf, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
                          /*weight_pass=*/true);
}

// The benchmark offers what the heuristic does ("timed" as offer_algorithms orders them), counted.
cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t handle, cudnnTensorDescriptor_t x,
                                                   cudnnFilterDescriptor_t w,
                                                   cudnnConvolutionDescriptor_t conv,
                                                   cudnnTensorDescriptor_t y, int requested,
                                                   int* returned,
                                                   cudnnConvolutionFwdAlgoPerf_t* perf) {
  count_call("cudnnFindConvolutionForwardAlgorithm");
  return cudnnGetConvolutionForwardAlgorithm_v7(handle, x, w, conv, y, requested, returned, perf);
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(
    cudnnHandle_t handle, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dx, int requested, int* returned,
    cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  count_call("cudnnFindConvolutionBackwardDataAlgorithm");
  return cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, w, dy, conv, dx, requested, returned,
                                                     perf);
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(
    cudnnHandle_t handle, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dw, int requested, int* returned,
    cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  count_call("cudnnFindConvolutionBackwardFilterAlgorithm");
  return cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, x, dy, conv, dw, requested, returned,
                                                       perf);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                      cudnnTensorDescriptor_t x_desc, const void* x,
                                      cudnnFilterDescriptor_t w_desc, const void* w,
                                      cudnnConvolutionDescriptor_t conv,
                                      cudnnConvolutionFwdAlgo_t algo, void*, size_t,
                                      const void* beta, cudnnTensorDescriptor_t y_desc, void* y) {
  Conv2dGeometry g;
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (!geometry(x_desc, w_desc, conv, y_desc, g)) return CUDNN_STATUS_BAD_PARAM;
  if (!unit_scales(x_desc->type, alpha, beta)) return CUDNN_STATUS_NOT_SUPPORTED;
  count_call("cudnnConvolutionForward#" + std::to_string(int(algo)));
  return dispatch(handle, x_desc->type, conv->math, Pass::forward, g, x, w, y);
}
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                           cudnnFilterDescriptor_t w_desc, const void* w,
                                           cudnnTensorDescriptor_t dy_desc, const void* dy,
                                           cudnnConvolutionDescriptor_t conv,
                                           cudnnConvolutionBwdDataAlgo_t algo, void*, size_t,
                                           const void* beta, cudnnTensorDescriptor_t dx_desc,
                                           void* dx) {
  Conv2dGeometry g;
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (!geometry(dx_desc, w_desc, conv, dy_desc, g)) return CUDNN_STATUS_BAD_PARAM;
  if (!unit_scales(dx_desc->type, alpha, beta)) return CUDNN_STATUS_NOT_SUPPORTED;
  count_call("cudnnConvolutionBackwardData#" + std::to_string(int(algo)));
  return dispatch(handle, dx_desc->type, conv->math, Pass::data, g, w, dy, dx);
}
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             cudnnTensorDescriptor_t x_desc, const void* x,
                                             cudnnTensorDescriptor_t dy_desc, const void* dy,
                                             cudnnConvolutionDescriptor_t conv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void*, size_t,
                                             const void* beta, cudnnFilterDescriptor_t dw_desc,
                                             void* dw) {
  Conv2dGeometry g;
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (!geometry(x_desc, dw_desc, conv, dy_desc, g)) return CUDNN_STATUS_BAD_PARAM;
  if (!unit_scales(x_desc->type, alpha, beta)) return CUDNN_STATUS_NOT_SUPPORTED;
  count_call("cudnnConvolutionBackwardFilter#" + std::to_string(int(algo)));
  return dispatch(handle, x_desc->type, conv->math, Pass::weight, g, x, dy, dw);
}

// Batch normalization and pooling.

namespace {

namespace cpu = rg::kernels::cpu;
using rg::kernels::BatchNorm;
using rg::kernels::Cpu;

// Calls f.template operator()<T, P>() with the storage type T of a batch-norm or pooling data type
// and its compute type P, which is also the type of batch norm's parameters (f32 for half data,
// cuDNN's PSEUDO_HALF_CONFIG). bf16 is not emulated: kernels/cuda does not ask cuDNN for it.
template <class F>
cudnnStatus_t with_types(cudnnDataType_t type, F&& f) {
  switch (type) {
    case CUDNN_DATA_FLOAT:
      return f.template operator()<float, float>();
    case CUDNN_DATA_DOUBLE:
      return f.template operator()<double, double>();
    case CUDNN_DATA_HALF:
      return f.template operator()<rg::Half, float>();
    default:
      return CUDNN_STATUS_NOT_SUPPORTED;
  }
}

cudnnDataType_t param_type(cudnnDataType_t type) {
  return type == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
}

bool same_shape(const cudnnTensorStruct* a, const cudnnTensorStruct* b) {
  return a->type == b->type && a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w;
}

bool usable(const cudnnTensorStruct* d) { return d != nullptr && d->set && !d->nhwc; }

// The accesses of one call, leaving out the optional pointers that are null.
std::vector<rg::emu::MemAccess> accesses(std::initializer_list<rg::emu::MemAccess> all) {
  std::vector<rg::emu::MemAccess> out;
  for (const auto& a : all) {
    if (a.ptr != nullptr) out.push_back(a);
  }
  return out;
}

bool unit_scales(cudnnDataType_t type,
                 std::initializer_list<std::pair<const void*, const void*>> ab) {
  for (const auto& [alpha, beta] : ab) {
    if (alpha == nullptr || beta == nullptr || !unit_scales(type, alpha, beta)) return false;
  }
  return true;
}

// A spatial batch norm's [n, c, hw] view, checked as cuDNN checks it: x and y (or dy, dx) alike,
// the parameters 1 x C x 1 x 1 in the parameter type, eps at least CUDNN_BN_MIN_EPSILON; and
// alpha = 1, beta = 0, the only scales emulated.
struct BnShape {
  int64_t n, c, hw;
};
cudnnStatus_t bn_shape(cudnnHandle_t handle, cudnnBatchNormMode_t mode,
                       std::initializer_list<const cudnnTensorStruct*> data,
                       const cudnnTensorStruct* param, double eps,
                       std::initializer_list<std::pair<const void*, const void*>> scales,
                       BnShape& s) {
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (mode != CUDNN_BATCHNORM_SPATIAL) return CUDNN_STATUS_NOT_SUPPORTED;
  const cudnnTensorStruct* x = *data.begin();
  for (const cudnnTensorStruct* d : data) {
    if (!usable(d) || !same_shape(d, x)) return CUDNN_STATUS_BAD_PARAM;
  }
  if (!usable(param) || param->type != param_type(x->type) || param->n != 1 || param->c != x->c ||
      param->h != 1 || param->w != 1) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  if (!(eps >= CUDNN_BN_MIN_EPSILON)) return CUDNN_STATUS_BAD_PARAM;
  if (!unit_scales(x->type, scales)) return CUDNN_STATUS_NOT_SUPPORTED;
  s = {x->n, x->c, int64_t(x->h) * x->w};
  return CUDNN_STATUS_SUCCESS;
}

// 1 / sqrt(var + eps) per channel: what cuDNN saves as the "inverse variance".
std::vector<double> inverse_std(const std::vector<double>& var, double eps) {
  std::vector<double> invstd(var.size());
  for (size_t ch = 0; ch < var.size(); ++ch) invstd[ch] = 1.0 / std::sqrt(var[ch] + eps);
  return invstd;
}

// y = (x - mean) * invstd * scale + bias, computed in P and rounded to T.
template <class T, class P>
void normalize(const BnShape& s, const std::vector<P>& xv, const std::vector<double>& mean,
               const std::vector<double>& invstd, const void* scale, const void* bias, void* y) {
  std::vector<P> out(xv.size());
  BatchNorm<Cpu>::apply<P>(xv.data(), s.n, s.c, s.hw, mean.data(), invstd.data(),
                           static_cast<const P*>(scale), static_cast<const P*>(bias), nullptr,
                           false, out.data(), {});
  cpu::cast<P, T>(out.data(), static_cast<T*>(y), int64_t(out.size()));
}

// The per-channel values of a parameter tensor of type P, in double.
template <class P>
std::vector<double> channel_values(const void* p, int64_t c) {
  std::vector<double> v(static_cast<size_t>(c));
  for (int64_t ch = 0; ch < c; ++ch) v[size_t(ch)] = double(static_cast<const P*>(p)[ch]);
  return v;
}

}  // namespace

cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derived_desc,
                                            const cudnnTensorDescriptor_t x_desc,
                                            cudnnBatchNormMode_t mode) {
  if (derived_desc == nullptr || !usable(x_desc)) return CUDNN_STATUS_BAD_PARAM;
  if (mode == CUDNN_BATCHNORM_PER_ACTIVATION) {
    *derived_desc = {true, param_type(x_desc->type), 1, x_desc->c, x_desc->h, x_desc->w};
  } else {
    *derived_desc = {true, param_type(x_desc->type), 1, x_desc->c, 1, 1};
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
    const cudnnTensorDescriptor_t x_desc, const void* x, const cudnnTensorDescriptor_t y_desc,
    void* y, const cudnnTensorDescriptor_t scale_bias_mean_var_desc, const void* scale,
    const void* bias, double exponential_average_factor, void* result_running_mean,
    void* result_running_variance, double epsilon, void* result_save_mean,
    void* result_save_inv_variance) {
  BnShape s{};
  if (const cudnnStatus_t st = bn_shape(handle, mode, {x_desc, y_desc}, scale_bias_mean_var_desc,
                                        epsilon, {{alpha, beta}}, s);
      st != CUDNN_STATUS_SUCCESS) {
    return st;
  }
  // Running statistics and saved results: both or neither (as cuDNN requires).
  if ((result_running_mean == nullptr) != (result_running_variance == nullptr) ||
      (result_save_mean == nullptr) != (result_save_inv_variance == nullptr) || x == nullptr ||
      y == nullptr || scale == nullptr || bias == nullptr) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  return with_types(x_desc->type, [&]<class T, class P>() {
    const size_t data = size_t(s.n * s.c * s.hw) * sizeof(T), param = size_t(s.c) * sizeof(P);
    queue(handle, "cudnnBatchNormalizationForwardTraining",
          accesses({{x, data, false},
                    {y, data, true},
                    {scale, param, false},
                    {bias, param, false},
                    {result_running_mean, param, true},
                    {result_running_variance, param, true},
                    {result_save_mean, param, true},
                    {result_save_inv_variance, param, true}}),
          [=] {
            const std::vector<P> xv = widen<T, P>(x, s.n * s.c * s.hw);
            std::vector<double> mean(size_t(s.c)), var(size_t(s.c));
            BatchNorm<Cpu>::stats<P>(xv.data(), s.n, s.c, s.hw, mean.data(), var.data(), nullptr,
                                     0.0, {}, {});
            const std::vector<double> invstd = inverse_std(var, epsilon);
            normalize<T, P>(s, xv, mean, invstd, scale, bias, y);
            // cuDNN's running variance takes the unbiased batch variance, as
            // BatchNorm<B>::update_running does.
            BatchNorm<Cpu>::update_running<P>(
                static_cast<P*>(result_running_mean), static_cast<P*>(result_running_variance),
                mean.data(), var.data(), s.c, s.n * s.hw, exponential_average_factor, {});
            if (result_save_mean != nullptr) {
              for (int64_t ch = 0; ch < s.c; ++ch) {
                static_cast<P*>(result_save_mean)[ch] = P(mean[size_t(ch)]);
                // "InvVariance" is 1 / sqrt(var + eps), the inverse standard deviation.
                static_cast<P*>(result_save_inv_variance)[ch] = P(invstd[size_t(ch)]);
              }
            }
          });
    return CUDNN_STATUS_SUCCESS;
  });
}

cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
    const cudnnTensorDescriptor_t x_desc, const void* x, const cudnnTensorDescriptor_t y_desc,
    void* y, const cudnnTensorDescriptor_t scale_bias_mean_var_desc, const void* scale,
    const void* bias, const void* estimated_mean, const void* estimated_variance, double epsilon) {
  BnShape s{};
  if (const cudnnStatus_t st = bn_shape(handle, mode, {x_desc, y_desc}, scale_bias_mean_var_desc,
                                        epsilon, {{alpha, beta}}, s);
      st != CUDNN_STATUS_SUCCESS) {
    return st;
  }
  if (x == nullptr || y == nullptr || scale == nullptr || bias == nullptr ||
      estimated_mean == nullptr || estimated_variance == nullptr) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  return with_types(x_desc->type, [&]<class T, class P>() {
    const size_t data = size_t(s.n * s.c * s.hw) * sizeof(T), param = size_t(s.c) * sizeof(P);
    queue(handle, "cudnnBatchNormalizationForwardInference",
          accesses({{x, data, false},
                    {y, data, true},
                    {scale, param, false},
                    {bias, param, false},
                    {estimated_mean, param, false},
                    {estimated_variance, param, false}}),
          [=] {
            const std::vector<P> xv = widen<T, P>(x, s.n * s.c * s.hw);
            normalize<T, P>(s, xv, channel_values<P>(estimated_mean, s.c),
                            inverse_std(channel_values<P>(estimated_variance, s.c), epsilon), scale,
                            bias, y);
          });
    return CUDNN_STATUS_SUCCESS;
  });
}

cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha_data_diff,
    const void* beta_data_diff, const void* alpha_param_diff, const void* beta_param_diff,
    const cudnnTensorDescriptor_t x_desc, const void* x, const cudnnTensorDescriptor_t dy_desc,
    const void* dy, const cudnnTensorDescriptor_t dx_desc, void* dx,
    const cudnnTensorDescriptor_t scale_bias_diff_desc, const void* scale, void* scale_diff,
    void* bias_diff, double epsilon, const void* saved_mean, const void* saved_inv_variance) {
  BnShape s{};
  if (const cudnnStatus_t st =
          bn_shape(handle, mode, {x_desc, dy_desc, dx_desc}, scale_bias_diff_desc, epsilon,
                   {{alpha_data_diff, beta_data_diff}, {alpha_param_diff, beta_param_diff}}, s);
      st != CUDNN_STATUS_SUCCESS) {
    return st;
  }
  if ((saved_mean == nullptr) != (saved_inv_variance == nullptr) || x == nullptr || dy == nullptr ||
      dx == nullptr || scale == nullptr || scale_diff == nullptr || bias_diff == nullptr) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  return with_types(x_desc->type, [&]<class T, class P>() {
    const size_t data = size_t(s.n * s.c * s.hw) * sizeof(T), param = size_t(s.c) * sizeof(P);
    queue(handle, "cudnnBatchNormalizationBackward",
          accesses({{x, data, false},
                    {dy, data, false},
                    {dx, data, true},
                    {scale, param, false},
                    {scale_diff, param, true},
                    {bias_diff, param, true},
                    {saved_mean, param, false},
                    {saved_inv_variance, param, false}}),
          [=] {
            const int64_t total = s.n * s.c * s.hw;
            const std::vector<P> xv = widen<T, P>(x, total), gyv = widen<T, P>(dy, total);
            std::vector<double> mean(size_t(s.c)), invstd(size_t(s.c));
            if (saved_mean != nullptr) {
              mean = channel_values<P>(saved_mean, s.c);
              invstd = channel_values<P>(saved_inv_variance, s.c);
            } else {  // recomputed from x, as cuDNN does without the cache
              std::vector<double> var(size_t(s.c));
              BatchNorm<Cpu>::stats<P>(xv.data(), s.n, s.c, s.hw, mean.data(), var.data(), nullptr,
                                       0.0, {}, {});
              invstd = inverse_std(var, epsilon);
            }
            std::vector<P> gx(static_cast<size_t>(total));
            BatchNorm<Cpu>::backward<P>(
                gyv.data(), xv.data(), s.n, s.c, s.hw, mean.data(), invstd.data(),
                static_cast<const P*>(scale), nullptr, nullptr, true, false, gx.data(),
                static_cast<P*>(scale_diff), static_cast<P*>(bias_diff), nullptr, {}, {});
            cpu::cast<P, T>(gx.data(), static_cast<T*>(dx), total);
          });
    return CUDNN_STATUS_SUCCESS;
  });
}

cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t* desc) {
  return create_descriptor(desc, "cudnnCreatePoolingDescriptor");
}
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t desc) {
  return destroy_descriptor(desc);
}
cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t desc, cudnnPoolingMode_t mode,
                                          cudnnNanPropagation_t, int window_height,
                                          int window_width, int vertical_padding,
                                          int horizontal_padding, int vertical_stride,
                                          int horizontal_stride) {
  if (desc == nullptr || window_height <= 0 || window_width <= 0 || vertical_padding < 0 ||
      horizontal_padding < 0 || vertical_stride <= 0 || horizontal_stride <= 0) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  *desc = {true,
           mode,
           window_height,
           window_width,
           vertical_padding,
           horizontal_padding,
           vertical_stride,
           horizontal_stride};
  return CUDNN_STATUS_SUCCESS;
}

namespace {

// The pooling geometry the descriptors describe, checked as cuDNN does: one data type, y (and
// dy) of x's batch and channels and of the pooling's output size, rounded down.
cudnnStatus_t pool_geometry(cudnnHandle_t handle, cudnnPoolingDescriptor_t pool,
                            const cudnnTensorStruct* x, const cudnnTensorStruct* y,
                            rg::kernels::Pool2dGeometry& g) {
  if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
  if (pool == nullptr || !pool->set || !usable(x) || !usable(y) || x->type != y->type) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  if (pool->mode != CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING &&
      pool->mode != CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING) {
    return CUDNN_STATUS_NOT_SUPPORTED;  // max pooling is not emulated
  }
  if (2 * pool->ph > pool->kh || 2 * pool->pw > pool->kw) {
    return CUDNN_STATUS_NOT_SUPPORTED;  // windows wholly in the padding: Pool<Cpu> rejects them
  }
  if (x->h + 2 * pool->ph < pool->kh || x->w + 2 * pool->pw < pool->kw) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  g = rg::kernels::Pool2dGeometry{int64_t(x->n) * x->c,
                                  x->h,
                                  x->w,
                                  pool->kh,
                                  pool->kw,
                                  pool->sh,
                                  pool->sw,
                                  pool->ph,
                                  pool->pw,
                                  0,
                                  0};
  g.ho = (g.h + 2 * g.ph - g.kh) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - g.kw) / g.sw + 1;
  if (y->n != x->n || y->c != x->c || y->h != g.ho || y->w != g.wo) return CUDNN_STATUS_BAD_PARAM;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t desc,
                                  const void* alpha, const cudnnTensorDescriptor_t x_desc,
                                  const void* x, const void* beta,
                                  const cudnnTensorDescriptor_t y_desc, void* y) {
  rg::kernels::Pool2dGeometry g{};
  if (const cudnnStatus_t st = pool_geometry(handle, desc, x_desc, y_desc, g);
      st != CUDNN_STATUS_SUCCESS) {
    return st;
  }
  if (!unit_scales(x_desc->type, {{alpha, beta}})) return CUDNN_STATUS_NOT_SUPPORTED;
  if (x == nullptr || y == nullptr) return CUDNN_STATUS_BAD_PARAM;
  const bool include_pad = desc->mode == CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
  return with_types(x_desc->type, [&]<class T, class P>() {
    queue(handle, "cudnnPoolingForward",
          {{x, size_t(g.planes * g.h * g.w) * sizeof(T), false},
           {y, size_t(g.planes * g.ho * g.wo) * sizeof(T), true}},
          [=] {
            const std::vector<P> xv = widen<T, P>(x, g.planes * g.h * g.w);
            std::vector<P> out(size_t(g.planes * g.ho * g.wo));
            rg::kernels::Pool<Cpu>::avg_pool2d<P>(g, xv.data(), out.data(), include_pad, {});
            cpu::cast<P, T>(out.data(), static_cast<T*>(y), int64_t(out.size()));
          });
    return CUDNN_STATUS_SUCCESS;
  });
}

cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t desc,
                                   const void* alpha, const cudnnTensorDescriptor_t y_desc,
                                   const void* y, const cudnnTensorDescriptor_t dy_desc,
                                   const void* dy, const cudnnTensorDescriptor_t x_desc,
                                   const void* x, const void* beta,
                                   const cudnnTensorDescriptor_t dx_desc, void* dx) {
  rg::kernels::Pool2dGeometry g{};
  if (const cudnnStatus_t st = pool_geometry(handle, desc, x_desc, y_desc, g);
      st != CUDNN_STATUS_SUCCESS) {
    return st;
  }
  if (!usable(dy_desc) || !same_shape(dy_desc, y_desc) || !usable(dx_desc) ||
      !same_shape(dx_desc, x_desc)) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  if (!unit_scales(x_desc->type, {{alpha, beta}})) return CUDNN_STATUS_NOT_SUPPORTED;
  if (x == nullptr || y == nullptr || dy == nullptr || dx == nullptr) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  const bool include_pad = desc->mode == CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
  return with_types(x_desc->type, [&]<class T, class P>() {
    const size_t in = size_t(g.planes * g.h * g.w) * sizeof(T),
                 out = size_t(g.planes * g.ho * g.wo) * sizeof(T);
    // cuDNN's interface takes x and y too (max pooling needs them): declared as reads.
    queue(handle, "cudnnPoolingBackward",
          {{y, out, false}, {dy, out, false}, {x, in, false}, {dx, in, true}}, [=] {
            const std::vector<P> gyv = widen<T, P>(dy, g.planes * g.ho * g.wo);
            std::vector<P> gx(size_t(g.planes * g.h * g.w));
            rg::kernels::Pool<Cpu>::avg_pool2d_backward<P>(g, gyv.data(), gx.data(), include_pad,
                                                           {});
            cpu::cast<P, T>(gx.data(), static_cast<T*>(dx), int64_t(gx.size()));
          });
    return CUDNN_STATUS_SUCCESS;
  });
}

namespace rg::emu {
int cudnn_live_descriptors() { return live_descriptors.load(); }
int64_t cudnn_calls(std::string_view function) { return cudnn_detail::calls_of(function); }
void cudnn_set_conv_algorithms(CudnnConvAlgorithms offer) { conv_algorithms.store(offer); }
int64_t cudnn_conv_algo_calls(std::string_view function, int algo) {
  return cudnn_calls(std::string(function) + "#" + std::to_string(algo));
}
void check_status(cudnnStatus_t status, const char* call, const char* file, int line) {
  RG_CHECK(status == CUDNN_STATUS_SUCCESS, file, ":", line, ": ", call,
           " failed: ", cudnnGetErrorString(status));
}
}  // namespace rg::emu
