// The metrics kernels on CUDA (kernels/metrics.h): argmax and top-k hit counting. Rows
// (inner == 1) take one block each: a (value, index) reduction
// or a count of the classes ranked above the target, with warp shuffles then shared memory; other
// dimensions take one thread per column. No sort: a target is in the top k when fewer than k
// classes rank above it.
#include <math.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"
#include "kernels/half.h"
#include "kernels/metrics.h"

namespace rg::kernels {
namespace {

using cuda::detail::as_stream;
using cuda::detail::blocks_for;
using cuda::detail::compute_t;
using cuda::detail::dev;
using cuda::detail::device_t;
using cuda::detail::grid_start;
using cuda::detail::grid_stride;
using cuda::detail::kFullMask;
using cuda::detail::kThreads;
using cuda::detail::load;

constexpr unsigned int kRowThreads = 256;  // at most, per row block
constexpr int64_t kMaxGrid = 65535;        // row loops cover the rest
constexpr long long kNoIndex = 0x7fffffffffffffffll;

// a ranks above b: larger, or NaN against a number (NaN is the largest value, as in PyTorch).
template <class A>
__device__ __forceinline__ bool ranks_above(A a, A b) {
  return a > b || (a != a && b == b);
}
template <class A>
__device__ __forceinline__ bool ranks_same(A a, A b) {
  return a == b || (a != a && b != b);
}

// (value, index) a beats b: ranks above it, or ranks the same with a lower index.
template <class A>
__device__ __forceinline__ bool beats(A av, long long ai, A bv, long long bi) {
  return ranks_above(av, bv) || (ranks_same(av, bv) && ai < bi);
}

// The winning (value, index) of the warp, in every lane.
template <class A>
__device__ __forceinline__ void warp_argmax(A& best, long long& best_i) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const A v = __shfl_xor_sync(kFullMask, best, offset);
    const long long i = __shfl_xor_sync(kFullMask, best_i, offset);
    if (beats(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
}

template <class D>
__global__ void argmax_rows_kernel(const D* x, int64_t* out, int64_t rows, int64_t c) {
  using A = compute_t<D>;
  __shared__ A values[32];
  __shared__ long long indices[32];
  const unsigned int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const D* p = x + row * c;
    // A thread without elements holds (-inf, no index), which every element beats.
    A best = -INFINITY;
    long long best_i = kNoIndex;
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
      const A v = load(p[k]);
      if (beats(v, static_cast<long long>(k), best, best_i)) {
        best = v;
        best_i = k;
      }
    }
    warp_argmax(best, best_i);
    __syncthreads();  // a previous row's readers are done with the scratch arrays
    if (lane == 0) {
      values[warp] = best;
      indices[warp] = best_i;
    }
    __syncthreads();
    best = lane < blockDim.x / 32 ? values[lane] : A(-INFINITY);
    best_i = lane < blockDim.x / 32 ? indices[lane] : kNoIndex;
    warp_argmax(best, best_i);
    if (threadIdx.x == 0) out[row] = best_i;
  }
}

// One thread per (outer, inner) column, scanning c in order like the engine's loop.
template <class D>
__global__ void argmax_columns_kernel(const D* x, int64_t* out, int64_t outer, int64_t c,
                                      int64_t inner) {
  using A = compute_t<D>;
  for (int64_t t = grid_start(); t < outer * inner; t += grid_stride()) {
    const D* p = x + t / inner * c * inner + t % inner;
    A best = load(p[0]);
    int64_t best_i = 0;
    for (int64_t k = 1; k < c; ++k) {
      const A v = load(p[k * inner]);
      if (ranks_above(v, best)) {
        best = v;
        best_i = k;
      }
    }
    out[t] = best_i;
  }
}

// One block per row; each block adds its hits to counts[0] once and lowers counts[1] to its first
// row with a bad target (integer atomics).
template <class D>
__global__ void topk_correct_kernel(const D* logits, const int64_t* target, int64_t n, int64_t c,
                                    int64_t k, unsigned long long* counts) {
  using A = compute_t<D>;
  __shared__ long long scratch[32];
  const unsigned int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned long long hits = 0, first_bad = static_cast<unsigned long long>(n);
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const D* p = logits + row * c;
    const int64_t t = target[row];
    const bool valid = t >= 0 && t < c;
    // Rows come in increasing order, so the first bad one is this block's smallest.
    if (!valid && first_bad == static_cast<unsigned long long>(n))
      first_bad = static_cast<unsigned long long>(row);
    const A v = valid ? load(p[t]) : A(0);
    // Rank of the target: classes above it, plus equal classes that come before it.
    long long rank = 0;
    if (valid) {
      for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
        const A u = load(p[j]);
        rank += ranks_above(u, v) || (j < t && ranks_same(u, v));
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) rank += __shfl_xor_sync(kFullMask, rank, offset);
    __syncthreads();  // a previous row's readers are done with scratch
    if (lane == 0) scratch[warp] = rank;
    __syncthreads();
    if (threadIdx.x == 0) {
      long long total = 0;
      for (unsigned int w = 0; w < blockDim.x / 32; ++w) total += scratch[w];
      hits += valid && total < k;
    }
  }
  if (threadIdx.x == 0 && hits > 0) atomicAdd(counts, hits);
  if (threadIdx.x == 0 && first_bad < static_cast<unsigned long long>(n))
    atomicMin(counts + 1, first_bad);
}

unsigned int row_threads(int64_t len) {
  return static_cast<unsigned int>(std::clamp<int64_t>((len + 31) / 32 * 32, 32, kRowThreads));
}

unsigned int row_grid(int64_t rows) { return static_cast<unsigned int>(std::min(rows, kMaxGrid)); }

}  // namespace

template <>
template <class T>
void Metrics<Cuda>::argmax(const T* x, int64_t* out, int64_t outer, int64_t c, int64_t inner,
                           Ctx ctx) {
  using D = device_t<T>;
  detail::check_argmax_sizes(outer, c, inner);
  if (outer == 0 || inner == 0) return;
  const auto s = as_stream(ctx.stream);
  if (inner == 1) {
    RG_LAUNCH(argmax_rows_kernel<D>, row_grid(outer), row_threads(c), 0, s, dev(x), out, outer, c);
  } else {
    RG_LAUNCH(argmax_columns_kernel<D>, blocks_for(outer * inner), kThreads, 0, s, dev(x), out,
              outer, c, inner);
  }
}

template <>
template <class T>
void Metrics<Cuda>::topk_correct(const T* logits, const int64_t* target, int64_t n, int64_t c,
                                 int64_t k, int64_t* counts, Ctx ctx) {
  using D = device_t<T>;
  detail::check_topk_sizes(n, c, k);
  const auto s = as_stream(ctx.stream);
  RG_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int64_t), s));
  cuda::fill<int64_t>(counts + 1, n, 1, ctx.stream);
  if (n == 0) return;
  RG_LAUNCH(topk_correct_kernel<D>, row_grid(n), row_threads(c), 0, s, dev(logits), target, n, c, k,
            reinterpret_cast<unsigned long long*>(counts));
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_metrics_kernels() {
  using K = Metrics<Cuda>;
  return std::tuple{&K::argmax<T>, &K::topk_correct<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_metrics_kernels)

}  // namespace rg::kernels
