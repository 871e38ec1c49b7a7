// Sum/mean kernels: warp shuffles, then a block reduction through shared memory; across blocks a
// second pass over per-block partials (sum_all) instead of atomics, so results are deterministic.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/cuda/reduce.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::kernels::cuda {
namespace {

using detail::as_stream;
using detail::block_sum;
using detail::compute_t;
using detail::dev;
using detail::device_t;
using detail::kFullMask;
using detail::load;
using detail::store;
using detail::warp_sum;

constexpr unsigned int kBlock = 256;       // threads of the 1-D reduction kernels
constexpr int64_t kPerThread = 4;          // sum_all: elements per thread before a new block
constexpr int64_t kMaxPartials = 1024;     // sum_all: first-pass blocks (one finishing block)
constexpr int64_t kMaxGrid = 65535;        // row/column loops cover the rest
constexpr unsigned int kColumnWarps = 16;  // sum_dim with inner > 1: threads along r per column

// One block per row of r contiguous elements (inner == 1).
template <class D>
__global__ void sum_rows_kernel(const D* in, D* out, int64_t rows, int64_t r, compute_t<D> scale) {
  using A = compute_t<D>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const D* p = in + row * r;
    A acc = 0;
    for (int64_t k = threadIdx.x; k < r; k += blockDim.x) acc += load(p[k]);
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[row] = store<D>(acc * scale);
  }
}

// inner > 1: a block of 32 x kColumnWarps threads covers 32 adjacent columns (coalesced reads);
// the kColumnWarps threads of a column split r and are added in a fixed order.
template <class D>
__global__ void sum_columns_kernel(const D* in, D* out, int64_t outer, int64_t r, int64_t inner,
                                   compute_t<D> scale) {
  using A = compute_t<D>;
  __shared__ A part[kColumnWarps][33];
  const int64_t tiles = (inner + 31) / 32;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int64_t col = tile * 32 + threadIdx.x;
      A acc = 0;
      if (col < inner) {
        const D* p = in + o * r * inner + col;
        for (int64_t k = threadIdx.y; k < r; k += kColumnWarps) acc += load(p[k * inner]);
      }
      part[threadIdx.y][threadIdx.x] = acc;
      __syncthreads();
      if (threadIdx.y == 0 && col < inner) {
        A sum = 0;
        for (unsigned int y = 0; y < kColumnWarps; ++y) sum += part[y][threadIdx.x];
        out[o * inner + col] = store<D>(sum * scale);
      }
      __syncthreads();
    }
  }
}

// sum_all's first pass (partials != null: one partial per block) or its only pass (one block,
// writes scale * sum to out).
template <class D>
__global__ void sum_all_kernel(const D* in, int64_t n, compute_t<D>* partials, D* out,
                               compute_t<D> scale) {
  using A = compute_t<D>;
  __shared__ A scratch[32];
  A acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    acc += load(in[i]);
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) {
    if (partials) {
      partials[blockIdx.x] = acc;
    } else {
      *out = store<D>(acc * scale);
    }
  }
}

// sum_all's second pass: one block adds the partials.
template <class D>
__global__ void sum_partials_kernel(const compute_t<D>* partials, int64_t count, D* out,
                                    compute_t<D> scale) {
  using A = compute_t<D>;
  __shared__ A scratch[32];
  A acc = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = store<D>(acc * scale);
}

// Threads for a row of `len` elements: whole warps, at most kBlock.
unsigned int row_threads(int64_t len) {
  return static_cast<unsigned int>(std::clamp<int64_t>((len + 31) / 32 * 32, 32, kBlock));
}

int64_t sum_all_blocks(int64_t n) {
  return std::clamp<int64_t>((n + kBlock * kPerThread - 1) / (kBlock * kPerThread), 1,
                             kMaxPartials);
}

template <class T>
void reduce_dim(const char* op, const T* in, T* out, int64_t outer, int64_t r, int64_t inner,
                bool mean, void* stream) {
  using D = device_t<T>;
  using A = compute_t<D>;
  RG_CHECK(outer >= 0 && r >= 0 && inner >= 0, op, ": sizes must be non-negative, got outer ",
           outer, ", r ", r, ", inner ", inner);
  if (outer == 0 || inner == 0) return;
  RG_CHECK(out != nullptr && (in != nullptr || r == 0), op, ": null device pointer");
  const A scale = mean ? static_cast<A>(1.0 / static_cast<double>(r)) : A(1);
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
void reduce_all(const char* op, const T* in, int64_t n, T* out, void* workspace, bool mean,
                void* stream) {
  using D = device_t<T>;
  using A = compute_t<D>;
  RG_CHECK(n >= 0, op, ": n must be non-negative, got ", n);
  RG_CHECK(out != nullptr && (in != nullptr || n == 0), op, ": null device pointer");
  const A scale = mean ? static_cast<A>(1.0 / static_cast<double>(n)) : A(1);
  const auto s = as_stream(stream);
  const int64_t blocks = sum_all_blocks(n);
  if (blocks == 1) {
    RG_LAUNCH(sum_all_kernel<D>, 1u, kBlock, 0, s, dev(in), n, static_cast<A*>(nullptr), dev(out),
              scale);
    return;
  }
  RG_CHECK(workspace != nullptr, op, ": ", n, " elements need a workspace of ",
           sum_all_workspace_bytes(n), " bytes, got null");
  A* partials = static_cast<A*>(workspace);
  RG_LAUNCH(sum_all_kernel<D>, static_cast<unsigned int>(blocks), kBlock, 0, s, dev(in), n,
            partials, static_cast<D*>(nullptr), A(1));
  RG_LAUNCH(sum_partials_kernel<D>, 1u, 1024u, 0, s, partials, blocks, dev(out), scale);
}

}  // namespace

int64_t sum_all_workspace_bytes(int64_t n) {
  const int64_t blocks = sum_all_blocks(std::max<int64_t>(n, 0));
  return blocks == 1 ? 0 : blocks * static_cast<int64_t>(sizeof(double));
}

template <class T>
void sum_dim(const T* in, T* out, int64_t outer, int64_t r, int64_t inner, void* stream) {
  reduce_dim("sum_dim", in, out, outer, r, inner, false, stream);
}

template <class T>
void mean_dim(const T* in, T* out, int64_t outer, int64_t r, int64_t inner, void* stream) {
  reduce_dim("mean_dim", in, out, outer, r, inner, true, stream);
}

template <class T>
void sum_all(const T* in, int64_t n, T* out, void* workspace, void* stream) {
  reduce_all("sum_all", in, n, out, workspace, false, stream);
}

template <class T>
void mean_all(const T* in, int64_t n, T* out, void* workspace, void* stream) {
  reduce_all("mean_all", in, n, out, workspace, true, stream);
}

#define RG_INSTANTIATE_REDUCE(T)                                             \
  template void sum_dim<T>(const T*, T*, int64_t, int64_t, int64_t, void*);  \
  template void mean_dim<T>(const T*, T*, int64_t, int64_t, int64_t, void*); \
  template void sum_all<T>(const T*, int64_t, T*, void*, void*);             \
  template void mean_all<T>(const T*, int64_t, T*, void*, void*);
RG_INSTANTIATE_REDUCE(float)
RG_INSTANTIATE_REDUCE(double)
RG_INSTANTIATE_REDUCE(Half)
RG_INSTANTIATE_REDUCE(BFloat16)
#undef RG_INSTANTIATE_REDUCE

}  // namespace rg::kernels::cuda
