// cuDNN convolution: RAII descriptors, one handle per (device, stream), and each pass's
// algorithm cached by shape. Uses cuDNN 9's convolution C API (cudnn_cnn.h; deprecated in favour
// of the graph API, but complete and stable).
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/cuda/check.h"
#include "kernels/cuda/conv2d.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::kernels::cuda {
namespace {

// Guards the handle table and the algorithm cache only: calls on different handles (devices,
// streams) run concurrently, each under its own handle's mutex (a cuDNN handle must not be used
// by two host threads at once).
std::mutex cache_mu;

template <class T>
constexpr cudnnDataType_t data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDNN_DATA_FLOAT;
  if constexpr (std::is_same_v<T, double>) return CUDNN_DATA_DOUBLE;
  if constexpr (std::is_same_v<T, Half>) return CUDNN_DATA_HALF;
  if constexpr (std::is_same_v<T, BFloat16>) return CUDNN_DATA_BFLOAT16;
}

int as_int(const char* what, int64_t v) {
  RG_CHECK(v >= 0 && v <= INT_MAX, "cuda::conv2d: ", what, " = ", v,
           " is outside cuDNN's int range");
  return int(v);
}

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc(cudnnDataType_t type, int64_t n, int64_t c, int64_t h, int64_t w) {
    RG_CUDA_CHECK(cudnnCreateTensorDescriptor(&d));
    RG_CUDA_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, type, as_int("n", n),
                                             as_int("channels", c), as_int("height", h),
                                             as_int("width", w)));
  }
  ~TensorDesc() { (void)cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc(cudnnDataType_t type, const Conv2dGeometry& g) {
    RG_CUDA_CHECK(cudnnCreateFilterDescriptor(&d));
    RG_CUDA_CHECK(cudnnSetFilter4dDescriptor(d, type, CUDNN_TENSOR_NCHW, as_int("o", g.o),
                                             as_int("c", g.c), as_int("kh", g.kh),
                                             as_int("kw", g.kw)));
  }
  ~FilterDesc() { (void)cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc(const Conv2dGeometry& g, cudnnDataType_t compute, cudnnMathType_t math) {
    RG_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&d));
    RG_CUDA_CHECK(cudnnSetConvolution2dDescriptor(
        d, as_int("ph", g.ph), as_int("pw", g.pw), as_int("sh", g.sh), as_int("sw", g.sw),
        as_int("dh", g.dh), as_int("dw", g.dw), CUDNN_CROSS_CORRELATION, compute));
    RG_CUDA_CHECK(cudnnSetConvolutionMathType(d, math));
  }
  ~ConvDesc() { (void)cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

// The descriptors of one convolution: x, w, y and the convolution itself.
template <class T>
struct Descriptors {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  Descriptors(const Conv2dGeometry& g, bool allow_tf32)
      : x(data_type<T>(), g.n, g.c, g.h, g.w),
        y(data_type<T>(), g.n, g.o, g.ho, g.wo),
        w(data_type<T>(), g),
        conv(g, std::is_same_v<T, double> ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT,
             std::is_same_v<T, float>    ? (allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH)
             : std::is_same_v<T, double> ? CUDNN_DEFAULT_MATH
                                         : CUDNN_TENSOR_OP_MATH) {}
};

struct Handle {
  cudnnHandle_t h = nullptr;
  std::mutex mu;
};

// The handle of (current device, stream), created on first use; it lives as long as the process,
// like cuBLAS's. A handle whose stream cannot be set is destroyed again, not kept half made.
Handle& handle_for(void* stream) {
  static std::map<std::pair<int, void*>, Handle> handles;
  int device = 0;
  RG_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(cache_mu);
  Handle& handle = handles[{device, stream}];
  if (handle.h == nullptr) {
    cudnnHandle_t h = nullptr;
    RG_CUDA_CHECK(cudnnCreate(&h));
    const cudnnStatus_t status = cudnnSetStream(h, static_cast<cudaStream_t>(stream));
    if (status != CUDNN_STATUS_SUCCESS) (void)cudnnDestroy(h);
    RG_CUDA_CHECK(status);
    handle.h = h;
  }
  return handle;
}

// No convolution to run: an empty batch, image or filter (cuDNN refuses zero-sized descriptors).
bool empty(const Conv2dGeometry& g) {
  return g.n == 0 || g.c == 0 || g.h == 0 || g.w == 0 || g.o == 0 || g.ho == 0 || g.wo == 0 ||
         g.kh == 0 || g.kw == 0;
}

struct Choice {
  int algo;
  size_t workspace;
};

// Picks from cuDNN's heuristic ranking: the first deterministic algorithm within the workspace
// limit, else the first within it.
template <class Perf>
Choice pick(const Perf* perf, int count, const char* pass) {
  const Perf* fallback = nullptr;
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > size_t(kMaxConvWorkspaceBytes)) continue;
    if (p.determinism == CUDNN_DETERMINISTIC) return {int(p.algo), p.memory};
    if (fallback == nullptr) fallback = &p;
  }
  RG_CHECK(fallback != nullptr, "cuda::conv2d: cuDNN offers no ", pass,
           " algorithm for this shape within a ", kMaxConvWorkspaceBytes >> 20, " MiB workspace");
  return {int(fallback->algo), fallback->memory};
}

using CacheKey = std::tuple<int, int, std::array<int64_t, 15>, int, bool>;

// The cached algorithm of (current device, geometry, dtype, pass, math), chosen on first use.
// Called with h's mutex held.
template <class T>
Choice choose(cudnnHandle_t h, const Descriptors<T>& d, const Conv2dGeometry& g, ConvPass pass,
              bool allow_tf32) {
  static std::map<CacheKey, Choice> cache;
  int device = 0;
  RG_CUDA_CHECK(cudaGetDevice(&device));
  const CacheKey key{
      device,
      int(pass),
      {g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.ho, g.wo},
      int(data_type<T>()),
      allow_tf32};
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  constexpr int kMax = 16;
  int count = 0;
  Choice c{};
  if (pass == ConvPass::forward) {
    cudnnConvolutionFwdAlgoPerf_t perf[kMax];
    RG_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.d, d.w.d, d.conv.d, d.y.d, kMax,
                                                         &count, perf));
    c = pick(perf, count, "forward");
  } else if (pass == ConvPass::backward_data) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
    RG_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w.d, d.y.d, d.conv.d, d.x.d,
                                                              kMax, &count, perf));
    c = pick(perf, count, "backward-data");
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
    RG_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x.d, d.y.d, d.conv.d, d.w.d,
                                                                kMax, &count, perf));
    c = pick(perf, count, "backward-weight");
  }
  std::lock_guard<std::mutex> lock(cache_mu);
  cache.emplace(key, c);
  return c;
}

// alpha = 1, beta = 0 in the type cuDNN expects: double for f64 data, float otherwise.
template <class T>
using scale_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
void check_workspace(Choice c, void* workspace, int64_t bytes) {
  RG_CHECK(bytes >= int64_t(c.workspace) && (workspace != nullptr || c.workspace == 0),
           "cuda::conv2d: the algorithm needs a workspace of ", c.workspace, " bytes, got ", bytes,
           " (size it with conv2d_workspace_bytes)");
}

}  // namespace

template <class T>
int64_t conv2d_workspace_bytes(const Conv2dGeometry& g, ConvPass pass, bool allow_tf32,
                               void* stream) {
  if (empty(g)) return 0;
  Handle& h = handle_for(stream);
  std::lock_guard<std::mutex> lock(h.mu);
  const Descriptors<T> d(g, allow_tf32);
  return int64_t(choose<T>(h.h, d, g, pass, allow_tf32).workspace);
}

template <class T>
void conv2d_forward(const Conv2dGeometry& g, const T* x, const T* w, T* y, bool allow_tf32,
                    void* workspace, int64_t workspace_bytes, void* stream) {
  if (empty(g)) {
    // y is empty unless the sum over c * kh * kw is: then the convolution is zero.
    const size_t bytes = size_t(g.n * g.o * g.ho * g.wo) * sizeof(T);
    if (bytes != 0) RG_CUDA_CHECK(cudaMemsetAsync(y, 0, bytes, static_cast<cudaStream_t>(stream)));
    return;
  }
  Handle& handle = handle_for(stream);
  std::lock_guard<std::mutex> lock(handle.mu);
  const Descriptors<T> d(g, allow_tf32);
  cudnnHandle_t h = handle.h;
  const Choice c = choose<T>(h, d, g, ConvPass::forward, allow_tf32);
  check_workspace<T>(c, workspace, workspace_bytes);
  const scale_t<T> one = 1, zero = 0;
  RG_CUDA_CHECK(cudnnConvolutionForward(h, &one, d.x.d, x, d.w.d, w, d.conv.d,
                                        cudnnConvolutionFwdAlgo_t(c.algo), workspace,
                                        size_t(workspace_bytes), &zero, d.y.d, y));
}

template <class T>
void conv2d_backward_data(const Conv2dGeometry& g, const T* w, const T* gy, T* gx, bool allow_tf32,
                          void* workspace, int64_t workspace_bytes, void* stream) {
  if (empty(g)) {
    const size_t bytes = size_t(g.n * g.c * g.h * g.w) * sizeof(T);
    if (bytes != 0) {
      RG_CUDA_CHECK(cudaMemsetAsync(gx, 0, bytes, static_cast<cudaStream_t>(stream)));
    }
    return;
  }
  Handle& handle = handle_for(stream);
  std::lock_guard<std::mutex> lock(handle.mu);
  const Descriptors<T> d(g, allow_tf32);
  cudnnHandle_t h = handle.h;
  const Choice c = choose<T>(h, d, g, ConvPass::backward_data, allow_tf32);
  check_workspace<T>(c, workspace, workspace_bytes);
  const scale_t<T> one = 1, zero = 0;
  RG_CUDA_CHECK(cudnnConvolutionBackwardData(h, &one, d.w.d, w, d.y.d, gy, d.conv.d,
                                             cudnnConvolutionBwdDataAlgo_t(c.algo), workspace,
                                             size_t(workspace_bytes), &zero, d.x.d, gx));
}

template <class T>
void conv2d_backward_weight(const Conv2dGeometry& g, const T* x, const T* gy, T* gw,
                            bool allow_tf32, void* workspace, int64_t workspace_bytes,
                            void* stream) {
  if (empty(g)) {
    // A sum over no samples (or no output pixels): zero.
    const size_t bytes = size_t(g.o * g.c * g.kh * g.kw) * sizeof(T);
    if (bytes != 0) {
      RG_CUDA_CHECK(cudaMemsetAsync(gw, 0, bytes, static_cast<cudaStream_t>(stream)));
    }
    return;
  }
  Handle& handle = handle_for(stream);
  std::lock_guard<std::mutex> lock(handle.mu);
  const Descriptors<T> d(g, allow_tf32);
  cudnnHandle_t h = handle.h;
  const Choice c = choose<T>(h, d, g, ConvPass::backward_weight, allow_tf32);
  check_workspace<T>(c, workspace, workspace_bytes);
  const scale_t<T> one = 1, zero = 0;
  RG_CUDA_CHECK(cudnnConvolutionBackwardFilter(h, &one, d.x.d, x, d.y.d, gy, d.conv.d,
                                               cudnnConvolutionBwdFilterAlgo_t(c.algo), workspace,
                                               size_t(workspace_bytes), &zero, d.w.d, gw));
}

#define RG_INSTANTIATE(T)                                                                      \
  template int64_t conv2d_workspace_bytes<T>(const Conv2dGeometry&, ConvPass, bool, void*);    \
  template void conv2d_forward<T>(const Conv2dGeometry&, const T*, const T*, T*, bool, void*,  \
                                  int64_t, void*);                                             \
  template void conv2d_backward_data<T>(const Conv2dGeometry&, const T*, const T*, T*, bool,   \
                                        void*, int64_t, void*);                                \
  template void conv2d_backward_weight<T>(const Conv2dGeometry&, const T*, const T*, T*, bool, \
                                          void*, int64_t, void*);
RG_INSTANTIATE(float)
RG_INSTANTIATE(double)
RG_INSTANTIATE(Half)
RG_INSTANTIATE(BFloat16)
#undef RG_INSTANTIATE

}  // namespace rg::kernels::cuda
