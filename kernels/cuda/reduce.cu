// Reduce<Cuda> (kernels/reduce.h): f64 sums with warp shuffles, then a block reduction through
// shared memory; across blocks (sum_all) a second pass over the per-chunk f64 partials instead of
// atomics, so results are deterministic.
#include <algorithm>
#include <cstdint>
#include <tuple>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"
#include "kernels/half.h"
#include "kernels/reduce.h"

namespace rg::kernels::cuda {
namespace {

using detail::as_stream;
using detail::block_sum;
using detail::dev;
using detail::device_t;
using detail::kFullMask;
using detail::load;
using detail::store;
using detail::warp_sum;

constexpr unsigned int kBlock = 256;       // threads of the 1-D reduction kernels
constexpr int64_t kMaxGrid = 65535;        // row/column loops cover the rest
constexpr unsigned int kColumnWarps = 16;  // sum_dim with inner > 1: threads along r per column

// One block per row of r contiguous elements (inner == 1).
template <class D>
__global__ void sum_rows_kernel(const D* in, D* out, int64_t rows, int64_t r, double scale) {
  __shared__ double scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const D* p = in + row * r;
    double acc = 0;
    for (int64_t k = threadIdx.x; k < r; k += blockDim.x) acc += static_cast<double>(load(p[k]));
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[row] = store<D>(acc * scale);
  }
}

// inner > 1: a block of 32 x kColumnWarps threads covers 32 adjacent columns (coalesced reads);
// the kColumnWarps threads of a column split r and are added in a fixed order.
template <class D>
__global__ void sum_columns_kernel(const D* in, D* out, int64_t outer, int64_t r, int64_t inner,
                                   double scale) {
  __shared__ double part[kColumnWarps][33];
  const int64_t tiles = (inner + 31) / 32;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int64_t col = tile * 32 + threadIdx.x;
      double acc = 0;
      if (col < inner) {
        const D* p = in + o * r * inner + col;
        for (int64_t k = threadIdx.y; k < r; k += kColumnWarps) {
          acc += static_cast<double>(load(p[k * inner]));
        }
      }
      part[threadIdx.y][threadIdx.x] = acc;
      __syncthreads();
      if (threadIdx.y == 0 && col < inner) {
        double sum = 0;
        for (unsigned int y = 0; y < kColumnWarps; ++y) sum += part[y][threadIdx.x];
        out[o * inner + col] = store<D>(sum * scale);
      }
      __syncthreads();
    }
  }
}

// sum_all's first pass: block b adds chunk b of `parts` ([n * b / parts, n * (b + 1) / parts),
// Reduce's partition) into partials[b].
template <class D>
__global__ void sum_chunks_kernel(const D* in, int64_t n, int64_t parts, double* partials) {
  __shared__ double scratch[32];
  const int64_t b = blockIdx.x;
  double acc = 0;
  for (int64_t i = n * b / parts + threadIdx.x; i < n * (b + 1) / parts; i += blockDim.x) {
    acc += static_cast<double>(load(in[i]));
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[b] = acc;
}

// sum_all's second pass: one block adds the partials (a fixed tree).
template <class D>
__global__ void sum_partials_kernel(const double* partials, int64_t count, D* out, double scale) {
  __shared__ double scratch[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = store<D>(acc * scale);
}

// Threads for a row of `len` elements: whole warps, at most kBlock.
unsigned int row_threads(int64_t len) {
  return static_cast<unsigned int>(std::clamp<int64_t>((len + 31) / 32 * 32, 32, kBlock));
}

template <class T>
void reduce_dim(const char* op, const T* in, T* out, int64_t outer, int64_t r, int64_t inner,
                bool mean, void* stream) {
  using D = device_t<T>;
  kernels::detail::check_reduce_sizes(op, outer, r, inner);
  if (outer == 0 || inner == 0) return;
  RG_CHECK(out != nullptr && (in != nullptr || r == 0), op, ": null device pointer");
  const double scale = mean ? 1.0 / static_cast<double>(r) : 1.0;
  const auto s = as_stream(stream);
  if (inner == 1) {
    const auto grid = static_cast<unsigned int>(std::min(outer, kMaxGrid));
    RG_LAUNCH(sum_rows_kernel<D>, grid, row_threads(r), 0, s, dev(in), dev(out), outer, r, scale);
    return;
  }
  const dim3 grid(static_cast<unsigned int>(std::min((inner + 31) / 32, kMaxGrid)),
                  static_cast<unsigned int>(std::min(outer, kMaxGrid)));
  RG_LAUNCH(sum_columns_kernel<D>, grid, dim3(32, kColumnWarps), 0, s, dev(in), dev(out), outer, r,
            inner, scale);
}

template <class T>
void reduce_all(const char* op, const T* in, int64_t n, T* out, Workspace workspace, bool mean,
                void* stream) {
  using D = device_t<T>;
  using K = Reduce<Cuda>;
  RG_CHECK(n >= 0, op, ": n must be non-negative, got ", n);
  RG_CHECK(out != nullptr && (in != nullptr || n == 0), op, ": null device pointer");
  RG_ASSERT(workspace.data != nullptr && workspace.bytes >= K::sum_all_workspace_bytes(n), op,
            ": needs a workspace of ", K::sum_all_workspace_bytes(n), " bytes");
  const double scale = mean ? 1.0 / static_cast<double>(n) : 1.0;
  const auto s = as_stream(stream);
  const int64_t parts = K::sum_all_partials(n);
  double* partials = static_cast<double*>(workspace.data);
  RG_LAUNCH(sum_chunks_kernel<D>, static_cast<unsigned int>(parts), kBlock, 0, s, dev(in), n, parts,
            partials);
  RG_LAUNCH(sum_partials_kernel<D>, 1u, 1024u, 0, s, partials, parts, dev(out), scale);
}

}  // namespace
}  // namespace rg::kernels::cuda

namespace rg::kernels {

template <>
template <class T>
void Reduce<Cuda>::sum_dim(const T* in, T* out, int64_t outer, int64_t r, int64_t inner, Ctx ctx) {
  cuda::reduce_dim("sum_dim", in, out, outer, r, inner, false, ctx.stream);
}

template <>
template <class T>
void Reduce<Cuda>::mean_dim(const T* in, T* out, int64_t outer, int64_t r, int64_t inner, Ctx ctx) {
  cuda::reduce_dim("mean_dim", in, out, outer, r, inner, true, ctx.stream);
}

template <>
template <class T>
void Reduce<Cuda>::sum_all(const T* in, int64_t n, T* out, Workspace workspace, Ctx ctx) {
  cuda::reduce_all("sum_all", in, n, out, workspace, false, ctx.stream);
}

template <>
template <class T>
void Reduce<Cuda>::mean_all(const T* in, int64_t n, T* out, Workspace workspace, Ctx ctx) {
  cuda::reduce_all("mean_all", in, n, out, workspace, true, ctx.stream);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_reduce_kernels() {
  using K = Reduce<Cuda>;
  return std::tuple{&K::sum_dim<T>, &K::mean_dim<T>, &K::sum_all<T>, &K::mean_all<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_reduce_kernels)

}  // namespace rg::kernels
