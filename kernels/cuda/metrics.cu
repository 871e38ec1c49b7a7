// argmax and top-k hit counting. Rows (inner == 1) take one block each: a (value, index) reduction
// or a count of the classes ranked above the target, with warp shuffles then shared memory; other
// dimensions take one thread per column. No sort: a target is in the top k when fewer than k
// classes rank above it.
#include <math.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/metrics.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::kernels::cuda {
namespace {

using detail::as_stream;
using detail::blocks_for;
using detail::compute_t;
using detail::dev;
using detail::device_t;
using detail::grid_start;
using detail::grid_stride;
using detail::kFullMask;
using detail::kThreads;
using detail::load;

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

template <class T>
void argmax(const T* x, int64_t* out, int64_t outer, int64_t c, int64_t inner, void* stream) {
  using D = device_t<T>;
  RG_CHECK(outer >= 0 && inner >= 0, "argmax: sizes must be non-negative, got outer ", outer,
           ", inner ", inner);
  RG_CHECK(c > 0, "argmax: cannot take the argmax of an empty dimension (c = ", c, ")");
  if (outer == 0 || inner == 0) return;
  const auto s = as_stream(stream);
  if (inner == 1) {
    RG_LAUNCH(argmax_rows_kernel<D>, row_grid(outer), row_threads(c), 0, s, dev(x), out, outer, c);
  } else {
    RG_LAUNCH(argmax_columns_kernel<D>, blocks_for(outer * inner), kThreads, 0, s, dev(x), out,
              outer, c, inner);
  }
}

template <class T>
void topk_correct(const T* logits, const int64_t* target, int64_t n, int64_t c, int64_t k,
                  int64_t* counts, void* stream) {
  using D = device_t<T>;
  RG_CHECK(n >= 0 && c > 0, "topk_correct: needs n >= 0 rows of c > 0 classes, got n ", n, ", c ",
           c);
  RG_CHECK(k >= 1 && k <= c, "topk_correct: k = ", k, " must be in [1, ", c, "] for ", c,
           " classes");
  const auto s = as_stream(stream);
  RG_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int64_t), s));
  fill<int64_t>(counts + 1, n, 1, stream);
  if (n == 0) return;
  RG_LAUNCH(topk_correct_kernel<D>, row_grid(n), row_threads(c), 0, s, dev(logits), target, n, c, k,
            reinterpret_cast<unsigned long long*>(counts));
}

#define RG_INSTANTIATE_METRICS(T)                                                              \
  template void argmax<T>(const T*, int64_t*, int64_t, int64_t, int64_t, void*);               \
  template void topk_correct<T>(const T*, const int64_t*, int64_t, int64_t, int64_t, int64_t*, \
                                void*);
RG_INSTANTIATE_METRICS(float)
RG_INSTANTIATE_METRICS(double)
RG_INSTANTIATE_METRICS(Half)
RG_INSTANTIATE_METRICS(BFloat16)
#undef RG_INSTANTIATE_METRICS

}  // namespace rg::kernels::cuda
