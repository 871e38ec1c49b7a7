// Conv2d<Cuda> (kernels/conv2d.h): cuDNN's convolution, plus our bias kernels (a per-channel add
// after the forward; the bias gradient as one block per channel summing in f64, as the CPU does).
// Each pass runs through cuDNN's graph API (kernels/cuda/conv2d_graph.cu) unless
// set_cudnn_conv_api(legacy) or the graph API has no usable engine for it; then through cuDNN 9's
// legacy convolution C API (cudnn_cnn.h; deprecated in favour of the graph API, but complete),
// here: RAII descriptors (cached per shape and thread) and handles (kernels/cuda/cudnn_common.h)
// and each pass's algorithm cached by shape.
#include <algorithm>
#include <array>
#include <tuple>
#include <type_traits>

#include "kernels/algorithm_policy.h"
#include "kernels/conv2d.h"
#include "kernels/conv_algo_cache.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/conv2d_graph.h"
#include "kernels/cuda/cudnn_common.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::kernels::cuda {
namespace {

using cudnn::as_int;
using cudnn::data_type;
using cudnn::LockedHandle;
using cudnn::scale_t;
using cudnn::TensorDesc;

constexpr const char* kOp = "cuda::conv2d";

struct FilterDesc : cudnn::Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor,
                                      cudnnDestroyFilterDescriptor> {
  FilterDesc(cudnnDataType_t type, const Conv2dGeometry& g) {
    RG_CUDA_CHECK(cudnnSetFilter4dDescriptor(d, type, tensor_format(g), as_int(kOp, "o", g.o),
                                             as_int(kOp, "c", g.c), as_int(kOp, "kh", g.kh),
                                             as_int(kOp, "kw", g.kw)));
  }
};

struct ConvDesc : cudnn::Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                                    cudnnDestroyConvolutionDescriptor> {
  ConvDesc(const Conv2dGeometry& g, cudnnDataType_t compute, cudnnMathType_t math) {
    RG_CUDA_CHECK(cudnnSetConvolution2dDescriptor(
        d, as_int(kOp, "ph", g.ph), as_int(kOp, "pw", g.pw), as_int(kOp, "sh", g.sh),
        as_int(kOp, "sw", g.sw), as_int(kOp, "dh", g.dh), as_int(kOp, "dw", g.dw),
        CUDNN_CROSS_CORRELATION, compute));
    RG_CUDA_CHECK(cudnnSetConvolutionMathType(d, math));
  }
};

// The descriptors of one convolution: x, w, y and the convolution itself.
template <class T>
struct Descriptors {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  Descriptors(const Conv2dGeometry& g, bool allow_tf32)
      : x(kOp, data_type<T>(), g.n, g.c, g.h, g.w, tensor_format(g)),
        y(kOp, data_type<T>(), g.n, g.o, g.ho, g.wo, tensor_format(g)),
        w(data_type<T>(), g),
        conv(g, std::is_same_v<T, double> ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT,
             std::is_same_v<T, float>    ? (allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH)
             : std::is_same_v<T, double> ? CUDNN_DEFAULT_MATH
                                         : CUDNN_TENSOR_OP_MATH) {}
};

// No convolution to run: an empty batch, image or filter (cuDNN refuses zero-sized descriptors).
bool empty(const Conv2dGeometry& g) {
  return g.n == 0 || g.c == 0 || g.h == 0 || g.w == 0 || g.o == 0 || g.ho == 0 || g.wo == 0 ||
         g.kh == 0 || g.kw == 0;
}

struct Choice {
  int algo;
  size_t workspace;
};

// Picks from cuDNN's candidates in their order (the heuristic's ranking, or measured time with
// benchmark), within the workspace limit: with `deterministic`, the first deterministic algorithm,
// and a pass that has none is an error naming it, as PyTorch's; with benchmark alone, the fastest
// (the point of timing); otherwise the first deterministic one, else the first. cuDNN marks as
// non-deterministic the algorithms that accumulate with float atomics (backward data ALGO_0,
// backward filter ALGO_0 and ALGO_3). The convolution runs in the descriptor's math type: running
// each candidate in the math type cuDNN reports for it (perf.mathType, as PyTorch's v7 path does)
// was tried and measured on an H200 (ResNet-18 b256 bf16: 16.8k img/s against about 21k this way,
// f32 unchanged, and --cudnn-benchmark still slower than the heuristics), so it was taken out.
template <class Perf>
Choice pick(const Perf* perf, int count, CudnnPass pass, bool deterministic, bool benchmark,
            int64_t limit) {
  const Perf* fallback = nullptr;
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > size_t(limit)) continue;
    if (p.determinism == CUDNN_DETERMINISTIC || (benchmark && !deterministic)) {
      return {int(p.algo), p.memory};
    }
    if (fallback == nullptr) fallback = &p;
  }
  RG_CHECK(!deterministic || fallback == nullptr, pass_name(pass),
           " on CUDA has no deterministic implementation for this shape: cuDNN offers only "
           "non-deterministic algorithms (float atomics) within a ",
           limit >> 20, " MiB workspace; run without --deterministic");
  RG_CHECK(fallback != nullptr, "cuda::conv2d: cuDNN offers no ", pass_name(pass),
           " algorithm for this shape within a ", limit, "-byte workspace");
  return {int(fallback->algo), fallback->memory};
}

// cuDNN's candidates for one pass: its heuristic's ranking (cudnnGet*_v7, instant), or with
// benchmark every algorithm run and timed on scratch buffers cuDNN allocates itself (cudnnFind*,
// fastest first), as torch.backends.cudnn.benchmark does. Called with h's mutex held.
template <class T>
Choice query(cudnnHandle_t h, const Descriptors<T>& d, CudnnPass pass, bool deterministic,
             bool benchmark, int64_t limit = kMaxConvWorkspaceBytes) {
  constexpr int kMax = 16;
  int count = 0;
  if (pass == CudnnPass::forward) {
    cudnnConvolutionFwdAlgoPerf_t perf[kMax];
    if (benchmark) {
      RG_CUDA_CHECK(cudnnFindConvolutionForwardAlgorithm(h, d.x.d, d.w.d, d.conv.d, d.y.d, kMax,
                                                         &count, perf));
    } else {
      RG_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.d, d.w.d, d.conv.d, d.y.d, kMax,
                                                           &count, perf));
    }
    return pick(perf, count, pass, deterministic, benchmark, limit);
  }
  if (pass == CudnnPass::backward_data) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
    if (benchmark) {
      RG_CUDA_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(h, d.w.d, d.y.d, d.conv.d, d.x.d,
                                                              kMax, &count, perf));
    } else {
      RG_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w.d, d.y.d, d.conv.d, d.x.d,
                                                                kMax, &count, perf));
    }
    return pick(perf, count, pass, deterministic, benchmark, limit);
  }
  cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
  if (benchmark) {
    RG_CUDA_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(h, d.x.d, d.y.d, d.conv.d, d.w.d,
                                                              kMax, &count, perf));
  } else {
    RG_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x.d, d.y.d, d.conv.d, d.w.d,
                                                                kMax, &count, perf));
  }
  return pick(perf, count, pass, deterministic, benchmark, limit);
}

// The legacy API's choice for RG_CUDNN_LOG (conv2d_graph.h's log_choice).
template <class T>
void log_legacy_choice(const Conv2dGeometry& g, CudnnPass pass, Choice c, bool benchmark) {
  log_choice("legacy API", g, pass, data_type<T>(),
             ::rg::detail::cat("algorithm ", c.algo, benchmark ? " (the fastest timed" : " (",
                               benchmark ? ", " : "", "workspace ", c.workspace, " bytes)"));
}

// The cached algorithm of (current device, geometry, dtype, pass, math, policy), chosen on first
// use (kernels/conv_algo_cache.h). Called with h's mutex held; h runs on `stream`.
template <class T>
Choice choose(cudnnHandle_t h, void* stream, const Descriptors<T>& d, const Conv2dGeometry& g,
              CudnnPass pass, bool allow_tf32, int64_t workspace = kMaxConvWorkspaceBytes) {
  static ConvAlgoCache<Choice> cache;
  int device = 0;
  RG_CUDA_CHECK(cudaGetDevice(&device));
  const bool deterministic = deterministic_algorithms(), benchmark = cudnn_benchmark();
  const ConvAlgoKey key =
      conv_algo_key(device, int(pass), g, int(data_type<T>()), int(tensor_format(g)), allow_tf32,
                    deterministic, benchmark);
  const Choice c = cache.get_or_choose(key, [&] {
    if (benchmark) {
      // cudnnFind* allocates and times on the stream: not inside a CUDA graph capture.
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      RG_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture));
      RG_CHECK(capture == cudaStreamCaptureStatusNone, "cuda::conv2d: the ", pass_name(pass),
               " of a configuration first seen inside a CUDA graph capture cannot be timed "
               "(--cudnn-benchmark); run it once before capturing, as train::GraphStep's "
               "warm-up steps do");
    }
    const Choice chosen = query<T>(h, d, pass, deterministic, benchmark);
    log_legacy_choice<T>(g, pass, chosen, benchmark);
    return chosen;
  });
  if (int64_t(c.workspace) <= workspace) return c;
  // Less workspace than the choice needs: the caller sized it for the graph API's plan, and this
  // pass fell back to the legacy API (conv2d_graph.h). The heuristics' best within it, uncached.
  return query<T>(h, d, pass, deterministic, false, workspace);
}

// The descriptors of (every geometry field, math), kept per thread (cudnn::cached; the dtype is
// in the descriptor type).
template <class T>
const Descriptors<T>& descriptors(const Conv2dGeometry& g, bool allow_tf32) {
  return cudnn::cached<Descriptors<T>>(
      std::tuple{g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.ho,
                 g.wo, g.channels_last, allow_tf32},
      g, allow_tf32);
}

template <class T>
void check_workspace(Choice c, void* workspace, int64_t bytes) {
  RG_CHECK(bytes >= int64_t(c.workspace) && (workspace != nullptr || c.workspace == 0),
           "cuda::conv2d: the algorithm needs a workspace of ", c.workspace, " bytes, got ", bytes,
           " (size it with Conv2d<Cuda>::workspace_bytes)");
}

template <class T>
int64_t pass_workspace_bytes(const Conv2dGeometry& g, CudnnPass pass, bool allow_tf32,
                             void* stream) {
  if (empty(g)) return 0;
  const int64_t graph = conv_graph::workspace_bytes(g, pass, data_type<T>(), allow_tf32, stream);
  if (graph >= 0) return graph;
  const LockedHandle h(stream);
  const Descriptors<T>& d = descriptors<T>(g, allow_tf32);
  return int64_t(choose<T>(h.get(), stream, d, g, pass, allow_tf32).workspace);
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
  if (conv_graph::run(g, CudnnPass::forward, data_type<T>(), allow_tf32, x, w, y, workspace,
                      workspace_bytes, stream)) {
    return;
  }
  const LockedHandle handle(stream);
  const Descriptors<T>& d = descriptors<T>(g, allow_tf32);
  cudnnHandle_t h = handle.get();
  const Choice c = choose<T>(h, stream, d, g, CudnnPass::forward, allow_tf32, workspace_bytes);
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
  if (conv_graph::run(g, CudnnPass::backward_data, data_type<T>(), allow_tf32, w, gy, gx, workspace,
                      workspace_bytes, stream)) {
    return;
  }
  const LockedHandle handle(stream);
  const Descriptors<T>& d = descriptors<T>(g, allow_tf32);
  cudnnHandle_t h = handle.get();
  const Choice c =
      choose<T>(h, stream, d, g, CudnnPass::backward_data, allow_tf32, workspace_bytes);
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
  if (conv_graph::run(g, CudnnPass::backward_weight, data_type<T>(), allow_tf32, x, gy, gw,
                      workspace, workspace_bytes, stream)) {
    return;
  }
  const LockedHandle handle(stream);
  const Descriptors<T>& d = descriptors<T>(g, allow_tf32);
  cudnnHandle_t h = handle.get();
  const Choice c =
      choose<T>(h, stream, d, g, CudnnPass::backward_weight, allow_tf32, workspace_bytes);
  check_workspace<T>(c, workspace, workspace_bytes);
  const scale_t<T> one = 1, zero = 0;
  RG_CUDA_CHECK(cudnnConvolutionBackwardFilter(h, &one, d.x.d, x, d.y.d, gy, d.conv.d,
                                               cudnnConvolutionBwdFilterAlgo_t(c.algo), workspace,
                                               size_t(workspace_bytes), &zero, d.w.d, gw));
}

// y[i, oc, :] += bias[oc], in the compute type; channels last: y[i, :, oc].
template <class D>
__global__ void add_bias_kernel(D* y, const D* bias, int64_t o, int64_t hw, int64_t total,
                                bool channels_last) {
  for (int64_t idx = detail::grid_start(); idx < total; idx += detail::grid_stride()) {
    const int64_t oc = channels_last ? idx % o : idx / hw % o;
    y[idx] = detail::store<D>(detail::load(y[idx]) + detail::load(bias[oc]));
  }
}

// gb[oc] = sum over the batch and pixels of gy[:, oc, :], one block per channel, in f64.
template <class D>
__global__ void bias_grad_kernel(const D* gy, D* gb, int64_t n, int64_t o, int64_t hw,
                                 bool channels_last) {
  __shared__ double scratch[32];
  for (int64_t oc = blockIdx.x; oc < o; oc += gridDim.x) {
    double acc = 0;
    for (int64_t j = threadIdx.x; j < n * hw; j += blockDim.x) {
      const int64_t at = channels_last ? j * o + oc : (j / hw * o + oc) * hw + j % hw;
      acc += static_cast<double>(detail::load(gy[at]));
    }
    acc = detail::block_sum(acc, scratch);
    if (threadIdx.x == 0) gb[oc] = detail::store<D>(acc);
  }
}

constexpr unsigned int kBiasThreads = 256;
constexpr int64_t kMaxGrid = 65535;

}  // namespace
}  // namespace rg::kernels::cuda

namespace rg::kernels {

using cuda::CudnnPass;

template <>
template <class T>
int64_t Conv2d<Cuda>::workspace_bytes(const Conv2dGeometry& g, ConvPass pass, bool allow_tf32,
                                      Ctx ctx) {
  if (pass == ConvPass::forward) {
    return cuda::pass_workspace_bytes<T>(g, CudnnPass::forward, allow_tf32, ctx.stream);
  }
  // In this order, so that a pass without an algorithm is reported the same way every time.
  const int64_t data =
      cuda::pass_workspace_bytes<T>(g, CudnnPass::backward_data, allow_tf32, ctx.stream);
  const int64_t weight =
      cuda::pass_workspace_bytes<T>(g, CudnnPass::backward_weight, allow_tf32, ctx.stream);
  return std::max(data, weight);
}

template <>
template <class T>
void Conv2d<Cuda>::forward(const Conv2dGeometry& g, const T* x, const T* w, const T* bias, T* y,
                           bool allow_tf32, Workspace workspace, Ctx ctx) {
  using D = cuda::detail::device_t<T>;
  cuda::conv2d_forward(g, x, w, y, allow_tf32, workspace.data, workspace.bytes, ctx.stream);
  const int64_t hw = g.ho * g.wo, total = g.n * g.o * hw;
  if (bias == nullptr || total == 0) return;
  RG_LAUNCH(cuda::add_bias_kernel<D>, cuda::detail::blocks_for(total), cuda::detail::kThreads, 0,
            cuda::detail::as_stream(ctx.stream), cuda::detail::dev(y), cuda::detail::dev(bias), g.o,
            hw, total, g.channels_last);
}

template <>
template <class T>
void Conv2d<Cuda>::backward(const Conv2dGeometry& g, const T* x, const T* w, const T* gy, T* gx,
                            T* gw, T* gb, bool allow_tf32, Workspace workspace, Ctx ctx) {
  using D = cuda::detail::device_t<T>;
  if (gb != nullptr && g.o > 0) {
    RG_LAUNCH(cuda::bias_grad_kernel<D>,
              static_cast<unsigned int>(std::min<int64_t>(g.o, cuda::kMaxGrid)), cuda::kBiasThreads,
              0, cuda::detail::as_stream(ctx.stream), cuda::detail::dev(gy), cuda::detail::dev(gb),
              g.n, g.o, g.ho * g.wo, g.channels_last);
  }
  if (gx != nullptr) {
    cuda::conv2d_backward_data(g, w, gy, gx, allow_tf32, workspace.data, workspace.bytes,
                               ctx.stream);
  }
  if (gw != nullptr) {
    cuda::conv2d_backward_weight(g, x, gy, gw, allow_tf32, workspace.data, workspace.bytes,
                                 ctx.stream);
  }
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_conv2d_kernels() {
  using K = Conv2d<Cuda>;
  return std::tuple{&K::workspace_bytes<T>, &K::forward<T>, &K::backward<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_conv2d_kernels)

}  // namespace rg::kernels
