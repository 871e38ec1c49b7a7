// The layer-norm kernels on CUDA (kernels/layer_norm.h). The forward and the input gradient take
// one block per row, its sums through warp shuffles then shared memory (a fixed tree); the weight
// and bias gradients sum each column over fixed chunks of rows into an f64 workspace, then the
// chunks in order: deterministic, no atomics.
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"
#include "kernels/half.h"
#include "kernels/layer_norm.h"

namespace rg::kernels {
namespace {

using cuda::detail::as_stream;
using cuda::detail::block_sum;
using cuda::detail::compute_t;
using cuda::detail::dev;
using cuda::detail::device_t;
using cuda::detail::load;
using cuda::detail::store;

constexpr unsigned int kRowThreads = 512;     // at most, per row block
constexpr int64_t kMaxGrid = 65535;           // row loops cover the rest
constexpr unsigned int kColumnThreads = 256;  // columns per block of the parameter gradients
constexpr int64_t kRowsPerChunk = 64;         // rows per partial sum of the parameter gradients
constexpr int64_t kMaxChunks = 64;

int64_t param_chunks(int64_t rows) {
  return std::clamp<int64_t>((rows + kRowsPerChunk - 1) / kRowsPerChunk, 1, kMaxChunks);
}

template <class D>
__global__ void forward_kernel(const D* x, int64_t rows, int64_t d, const D* weight, const D* bias,
                               double eps, D* y, compute_t<D>* mean, compute_t<D>* rstd) {
  using A = compute_t<D>;
  __shared__ A scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const D* p = x + r * d;
    D* q = y + r * d;
    A sum = 0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sum += load(p[j]);
    const A m = block_sum(sum, scratch) / static_cast<A>(d);
    // Second pass around the mean: no cancellation from E[x^2] - E[x]^2.
    A sq = 0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const A c = load(p[j]) - m;
      sq += c * c;
    }
    const A var = block_sum(sq, scratch) / static_cast<A>(d);
    const A is = static_cast<A>(1.0 / sqrt(static_cast<double>(var) + eps));
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = is;
    }
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      A v = (load(p[j]) - m) * is;
      if (weight) v = v * load(weight[j]);
      if (bias) v = v + load(bias[j]);
      q[j] = store<D>(v);
    }
  }
}

template <class D>
__global__ void input_grad_kernel(const D* gy, const D* x, int64_t rows, int64_t d,
                                  const compute_t<D>* mean, const compute_t<D>* rstd,
                                  const D* weight, D* gx) {
  using A = compute_t<D>;
  __shared__ A scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const D* g = gy + r * d;
    const D* p = x + r * d;
    D* q = gx + r * d;
    const A m = mean[r], is = rstd[r];
    A sum_g = 0, sum_g_xmu = 0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const A gw = weight ? load(g[j]) * load(weight[j]) : load(g[j]);
      sum_g += gw;
      sum_g_xmu += gw * (load(p[j]) - m);
    }
    const A mean_g = block_sum(sum_g, scratch) / static_cast<A>(d);
    const A mean_g_xhat = block_sum(sum_g_xmu, scratch) * is / static_cast<A>(d);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const A gw = weight ? load(g[j]) * load(weight[j]) : load(g[j]);
      const A xhat = (load(p[j]) - m) * is;
      q[j] = store<D>(is * (gw - mean_g - xhat * mean_g_xhat));
    }
  }
}

// Column j's sums of gy * xhat and gy over chunk blockIdx.y's rows, in f64, into
// partial[chunk * d + j] and partial[(chunks + chunk) * d + j].
template <class D>
__global__ void param_partial_kernel(const D* gy, const D* x, int64_t rows, int64_t d,
                                     const compute_t<D>* mean, const compute_t<D>* rstd,
                                     int64_t rows_per_chunk, double* partial) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  const int64_t chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t lo = chunk * rows_per_chunk;
  const int64_t hi = lo + rows_per_chunk < rows ? lo + rows_per_chunk : rows;
  double sw = 0, sb = 0;
  for (int64_t r = lo; r < hi; ++r) {
    const double gv = static_cast<double>(load(gy[r * d + j]));
    const double xhat = (static_cast<double>(load(x[r * d + j])) - static_cast<double>(mean[r])) *
                        static_cast<double>(rstd[r]);
    sw += gv * xhat;
    sb += gv;
  }
  partial[chunk * d + j] = sw;
  partial[(chunks + chunk) * d + j] = sb;
}

template <class D>
__global__ void param_finish_kernel(const double* partial, int64_t chunks, int64_t d, D* gweight,
                                    D* gbias) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  double sw = 0, sb = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    sw += partial[c * d + j];
    sb += partial[(chunks + c) * d + j];
  }
  if (gweight) gweight[j] = store<D>(sw);
  if (gbias) gbias[j] = store<D>(sb);
}

unsigned int row_threads(int64_t d) {
  return static_cast<unsigned int>(std::clamp<int64_t>((d + 31) / 32 * 32, 32, kRowThreads));
}

unsigned int row_grid(int64_t rows) { return static_cast<unsigned int>(std::min(rows, kMaxGrid)); }

unsigned int column_blocks(int64_t d) {
  return static_cast<unsigned int>((d + kColumnThreads - 1) / kColumnThreads);
}

}  // namespace

template <>
template <class T>
void LayerNorm<Cuda>::forward(const T* x, int64_t rows, int64_t d, const T* weight, const T* bias,
                              double eps, T* y, LayerNormStat<T>* mean, LayerNormStat<T>* rstd,
                              Ctx ctx) {
  using D = device_t<T>;
  static_assert(std::is_same_v<compute_t<D>, LayerNormStat<T>>);
  detail::check_layer_norm_sizes("layer_norm", rows, d);
  RG_CHECK(eps >= 0, "layer_norm: eps must be non-negative, got ", eps);
  if (rows == 0) return;
  RG_LAUNCH(forward_kernel<D>, row_grid(rows), row_threads(d), 0, as_stream(ctx.stream), dev(x),
            rows, d, dev(weight), dev(bias), eps, dev(y), mean, rstd);
}

template <>
int64_t LayerNorm<Cuda>::backward_workspace_bytes(int64_t rows, int64_t d) {
  return 2 * param_chunks(rows) * std::max<int64_t>(d, 1) * static_cast<int64_t>(sizeof(double));
}

template <>
template <class T>
void LayerNorm<Cuda>::backward(const T* gy, const T* x, int64_t rows, int64_t d,
                               const LayerNormStat<T>* mean, const LayerNormStat<T>* rstd,
                               const T* weight, T* gx, T* gweight, T* gbias, Workspace workspace,
                               Ctx ctx) {
  using D = device_t<T>;
  detail::check_layer_norm_sizes("layer_norm_backward", rows, d);
  if (gx && rows > 0 && d > 0) {
    RG_LAUNCH(input_grad_kernel<D>, row_grid(rows), row_threads(d), 0, as_stream(ctx.stream),
              dev(gy), dev(x), rows, d, mean, rstd, dev(weight), dev(gx));
  }
  if ((!gweight && !gbias) || d == 0) return;
  const int64_t chunks = param_chunks(rows);
  RG_ASSERT(workspace.data != nullptr && workspace.bytes >= backward_workspace_bytes(rows, d),
            "layer_norm_backward: needs a workspace of ", backward_workspace_bytes(rows, d),
            " bytes, got ", workspace.bytes);
  double* partial = static_cast<double*>(workspace.data);
  const int64_t rows_per_chunk = std::max<int64_t>((rows + chunks - 1) / chunks, 1);
  RG_LAUNCH(param_partial_kernel<D>, dim3(column_blocks(d), static_cast<unsigned int>(chunks)),
            kColumnThreads, 0, as_stream(ctx.stream), dev(gy), dev(x), rows, d, mean, rstd,
            rows_per_chunk, partial);
  RG_LAUNCH(param_finish_kernel<D>, column_blocks(d), kColumnThreads, 0, as_stream(ctx.stream),
            partial, chunks, d, dev(gweight), dev(gbias));
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_layer_norm_kernels() {
  using K = LayerNorm<Cuda>;
  return std::tuple{&K::forward<T>, &K::backward<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_layer_norm_kernels)

}  // namespace rg::kernels
