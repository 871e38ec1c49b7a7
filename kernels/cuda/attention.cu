// The causal self-attention kernels on CUDA (kernels/attention.h), in the spirit of
// FlashAttention, kept simple: the forward takes one block per (head, tile of query rows) and
// loops over tiles of keys with an online softmax (running max and sum per row), holding one
// tile x tile block of scores in shared memory at a time. The backward recomputes P from the saved
// log-sum-exp: a row pass for delta = rowsum(gout * out), then one block per query tile for gq and
// one block per key tile (looping over the query tiles at or after it) for gk and gv. Every output
// element is summed by one thread in a fixed order: deterministic, no atomics. Dropout multiplies
// each probability by its mask value, regenerated from Philox where the probability is computed
// (kernels/attention.h's layout: the same bits as the CPU's).
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/dropout.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::kernels {
namespace {

using cuda::detail::as_stream;
using cuda::detail::compute_t;
using cuda::detail::dev;
using cuda::detail::device_t;
using cuda::detail::exp_;
using cuda::detail::load;
using cuda::detail::log_;
using cuda::detail::store;

constexpr unsigned int kThreads = 128;
constexpr int64_t kMaxShared = 48 * 1024;  // bytes of dynamic shared memory per block
constexpr int64_t kMaxGrid = 65535;        // gridDim.y (heads): head loops cover the rest

// Shared values (of the accumulation type) the largest kernel (gk/gv) needs for a tile size:
// gk, gv, q and gout tiles of tile x d, P and dS tiles of tile x tile.
int64_t shared_values(int64_t tile, int64_t d) { return 4 * tile * d + 2 * tile * tile + 2 * tile; }

// The largest power-of-two tile (at most 32) whose shared memory fits.
int64_t tile_for(int64_t d, int64_t acc_bytes) {
  int64_t tile = 32;
  while (tile > 1 && shared_values(tile, d) * acc_bytes > kMaxShared) tile /= 2;
  RG_CHECK(shared_values(tile, d) * acc_bytes <= kMaxShared, "causal_attention: head size ", d,
           " is too large for the CUDA kernels");
  return tile;
}

// Attention dropout as the kernels see it: on is false for p = 0 (the dropout-free arithmetic).
template <class A>
struct DropMask {
  bool on;
  uint32_t threshold;
  A keep;  // 1 / (1 - p)
  uint64_t seed;
  philox::Offset offset;  // a CUDA graph's replays add a number in device memory

  // M[r, i, j] from the word of Philox block `w` (drawn for j's group).
  __device__ A of(const philox::U32x4& w, int64_t j) const {
    return (w.v[j % 4] >> 8) >= threshold ? keep : A(0);
  }
  __device__ philox::U32x4 block(int64_t r, int64_t i, int64_t j, int64_t t) const {
    return philox::block(seed, attention_dropout_group(offset.resolve(), r, i, j, t));
  }
  __device__ A at(int64_t r, int64_t i, int64_t j, int64_t t) const {
    return on ? of(block(r, i, j, t), j) : A(1);
  }
#if defined(RG_CUDA_EMU)
  template <class Accesses>
  void append_accesses(Accesses& out) const {
    offset.append_accesses(out);
  }
#endif
};

template <class A>
DropMask<A> drop_mask(double p, uint64_t seed, philox::Offset offset) {
  return DropMask<A>{p > 0, detail::dropout_keep_threshold(p), static_cast<A>(1.0 / (1.0 - p)),
                     seed, offset};
}

template <class A, class D>
__device__ A dot(const D* a, const D* b, int64_t d) {
  A s = 0;
  for (int64_t c = 0; c < d; ++c) s += load(a[c]) * load(b[c]);
  return s;
}

// The end of the tile of rows starting at lo.
__device__ __forceinline__ int64_t tile_end(int64_t lo, int64_t tile, int64_t t) {
  return lo + tile < t ? lo + tile : t;
}

// dst[e] = src[e] for e < n, in the accumulation type, strided over the block's threads.
template <class A, class D>
__device__ void load_tile(const D* src, int64_t n, A* dst) {
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) dst[e] = load(src[e]);
}

// acc[i, c] = acc[i, c] * (scale_rows ? scale_rows[i] : 1) + sum_{j < cols} w[i, j] x[j, c] for
// rows x d values of acc, w's rows `tile` apart: one thread per element, j in order.
template <class A>
__device__ void add_tile_product(A* acc, int64_t rows, int64_t d, const A* w, int64_t tile,
                                 int64_t cols, const A* x, const A* scale_rows) {
  for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x) {
    const int64_t i = e / d, c = e % d;
    A a = scale_rows ? acc[e] * scale_rows[i] : acc[e];
    for (int64_t j = 0; j < cols; ++j) a += w[i * tile + j] * x[j * d + c];
    acc[e] = a;
  }
}

// Block (query tile blockIdx.x, head blockIdx.y + multiples of gridDim.y).
template <class D>
__global__ void forward_kernel(const D* q, const D* k, const D* v, int64_t bh, int64_t t, int64_t d,
                               int64_t tile, compute_t<D> scale, DropMask<compute_t<D>> mask,
                               D* out, compute_t<D>* lse) {
  using A = compute_t<D>;
  RG_DYNAMIC_SHARED(A, shared);
  A* acc = shared;         // [tile, d]
  A* kt = acc + tile * d;  // [tile, d]
  A* vt = kt + tile * d;   // [tile, d]
  A* s = vt + tile * d;    // [tile, tile]: scores, then probabilities
  A* m = s + tile * tile;  // [tile]: running max
  A* l = m + tile;         // [tile]: running sum
  A* corr = l + tile;      // [tile]: this tile's rescaling of acc
  const int64_t q_lo = static_cast<int64_t>(blockIdx.x) * tile;
  const int64_t q_hi = tile_end(q_lo, tile, t);
  const int64_t rows = q_hi - q_lo;
  for (int64_t r = blockIdx.y; r < bh; r += gridDim.y) {
    const int64_t base = r * t * d;
    for (int64_t e = threadIdx.x; e < tile * d; e += blockDim.x) acc[e] = 0;
    for (int64_t i = threadIdx.x; i < tile; i += blockDim.x) {
      m[i] = -INFINITY;
      l[i] = 0;
    }
    __syncthreads();
    for (int64_t k_lo = 0; k_lo < q_hi; k_lo += tile) {
      const int64_t keys = tile_end(k_lo, tile, t) - k_lo;
      load_tile(k + base + k_lo * d, keys * d, kt);
      load_tile(v + base + k_lo * d, keys * d, vt);
      __syncthreads();
      for (int64_t e = threadIdx.x; e < rows * tile; e += blockDim.x) {
        const int64_t i = e / tile, j = e % tile;
        A sv = -INFINITY;
        if (j < keys && k_lo + j <= q_lo + i) {
          const D* qi = q + base + (q_lo + i) * d;
          A dv = 0;
          for (int64_t c = 0; c < d; ++c) dv += load(qi[c]) * kt[j * d + c];
          sv = scale * dv;
        }
        s[e] = sv;
      }
      __syncthreads();
      for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
        A mx = m[i];
        for (int64_t j = 0; j < keys; ++j) mx = s[i * tile + j] > mx ? s[i * tile + j] : mx;
        // Key k_lo + 0 <= q_lo + i in the first tile: mx is finite from then on.
        const A c = exp_(m[i] - mx);
        A sum = 0;
        for (int64_t j = 0; j < tile; ++j) {
          const A p = j < keys ? exp_(s[i * tile + j] - mx) : A(0);
          s[i * tile + j] = p;
          sum += p;
        }
        l[i] = l[i] * c + sum;
        m[i] = mx;
        corr[i] = c;
        if (mask.on) {  // the sum is P's; the values are weighted by P M
          philox::U32x4 w{};
          for (int64_t j = 0; j < keys; ++j) {
            if (j == 0 || (k_lo + j) % 4 == 0) w = mask.block(r, q_lo + i, k_lo + j, t);
            s[i * tile + j] *= mask.of(w, k_lo + j);
          }
        }
      }
      __syncthreads();
      add_tile_product(acc, rows, d, s, tile, keys, vt, corr);
      __syncthreads();
    }
    for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x) {
      const int64_t i = e / d;
      out[base + q_lo * d + e] = store<D>(acc[e] / l[i]);
    }
    for (int64_t i = threadIdx.x; i < rows; i += blockDim.x)
      lse[r * t + q_lo + i] = m[i] + log_(l[i]);
    __syncthreads();
  }
}

template <class D>
__global__ void delta_kernel(const D* gout, const D* out, int64_t rows, int64_t d,
                             compute_t<D>* delta) {
  using A = compute_t<D>;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  delta[row] = dot<A>(gout + row * d, out + row * d, d);
}

// P_ij M_ij and dS_ij for query row qrow (its gout row grow) against key and value tile rows krow,
// vrow; mij is M_ij (1 without dropout, which leaves the arithmetic exact).
template <class A, class D>
__device__ void p_ds(const D* qrow, const D* grow, const A* krow, const A* vrow, int64_t d, A scale,
                     A lse_i, A delta_i, A mij, A& pm, A& ds) {
  A sv = 0, dp = 0;
  for (int64_t c = 0; c < d; ++c) {
    sv += load(qrow[c]) * krow[c];
    dp += load(grow[c]) * vrow[c];
  }
  const A p = exp_(scale * sv - lse_i);
  ds = p * (dp * mij - delta_i);
  pm = p * mij;
}

// gq for query tile blockIdx.x: loops over the key tiles at or before it.
template <class D>
__global__ void query_grad_kernel(const D* gout, const D* q, const D* k, const D* v,
                                  const compute_t<D>* lse, const compute_t<D>* delta, int64_t bh,
                                  int64_t t, int64_t d, int64_t tile, compute_t<D> scale,
                                  DropMask<compute_t<D>> mask, D* gq) {
  using A = compute_t<D>;
  RG_DYNAMIC_SHARED(A, shared);
  A* acc = shared;         // [tile, d]
  A* kt = acc + tile * d;  // [tile, d]
  A* vt = kt + tile * d;   // [tile, d]
  A* ds = vt + tile * d;   // [tile, tile]
  const int64_t q_lo = static_cast<int64_t>(blockIdx.x) * tile;
  const int64_t q_hi = tile_end(q_lo, tile, t);
  const int64_t rows = q_hi - q_lo;
  for (int64_t r = blockIdx.y; r < bh; r += gridDim.y) {
    const int64_t base = r * t * d;
    for (int64_t e = threadIdx.x; e < tile * d; e += blockDim.x) acc[e] = 0;
    for (int64_t k_lo = 0; k_lo < q_hi; k_lo += tile) {
      const int64_t keys = tile_end(k_lo, tile, t) - k_lo;
      load_tile(k + base + k_lo * d, keys * d, kt);
      load_tile(v + base + k_lo * d, keys * d, vt);
      __syncthreads();
      for (int64_t e = threadIdx.x; e < rows * tile; e += blockDim.x) {
        const int64_t i = e / tile, j = e % tile;
        A p = 0, g = 0;
        if (j < keys && k_lo + j <= q_lo + i) {
          const int64_t qi = q_lo + i;
          p_ds(q + base + qi * d, gout + base + qi * d, kt + j * d, vt + j * d, d, scale,
               lse[r * t + qi], delta[r * t + qi], mask.at(r, qi, k_lo + j, t), p, g);
        }
        ds[e] = g;
      }
      __syncthreads();
      add_tile_product(acc, rows, d, ds, tile, keys, kt, static_cast<const A*>(nullptr));
      __syncthreads();
    }
    for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x)
      gq[base + q_lo * d + e] = store<D>(scale * acc[e]);
    __syncthreads();
  }
}

// gk and gv for key tile blockIdx.x: loops over the query tiles at or after it.
template <class D>
__global__ void key_value_grad_kernel(const D* gout, const D* q, const D* k, const D* v,
                                      const compute_t<D>* lse, const compute_t<D>* delta,
                                      int64_t bh, int64_t t, int64_t d, int64_t tile,
                                      compute_t<D> scale, DropMask<compute_t<D>> mask, D* gk,
                                      D* gv) {
  using A = compute_t<D>;
  RG_DYNAMIC_SHARED(A, shared);
  A* ak = shared;            // [tile, d]
  A* av = ak + tile * d;     // [tile, d]
  A* kt = av + tile * d;     // [tile, d]: this block's keys
  A* vt = kt + tile * d;     // [tile, d]: and values
  A* pt = vt + tile * d;     // [tile (queries), tile (keys)]
  A* ds = pt + tile * tile;  // [tile, tile]
  const int64_t k_lo = static_cast<int64_t>(blockIdx.x) * tile;
  const int64_t keys = tile_end(k_lo, tile, t) - k_lo;
  for (int64_t r = blockIdx.y; r < bh; r += gridDim.y) {
    const int64_t base = r * t * d;
    for (int64_t e = threadIdx.x; e < tile * d; e += blockDim.x) {
      ak[e] = 0;
      av[e] = 0;
    }
    load_tile(k + base + k_lo * d, keys * d, kt);
    load_tile(v + base + k_lo * d, keys * d, vt);
    __syncthreads();
    for (int64_t q_lo = k_lo; q_lo < t; q_lo += tile) {  // tiles are aligned: q_lo = k_lo first
      const int64_t q_hi = tile_end(q_lo, tile, t);
      const int64_t rows = q_hi - q_lo;
      for (int64_t e = threadIdx.x; e < tile * tile; e += blockDim.x) {
        const int64_t i = e / tile, j = e % tile;
        A p = 0, g = 0;
        if (i < rows && j < keys && k_lo + j <= q_lo + i) {
          const int64_t qi = q_lo + i;
          p_ds(q + base + qi * d, gout + base + qi * d, kt + j * d, vt + j * d, d, scale,
               lse[r * t + qi], delta[r * t + qi], mask.at(r, qi, k_lo + j, t), p, g);
        }
        pt[e] = p;
        ds[e] = g;
      }
      __syncthreads();
      for (int64_t e = threadIdx.x; e < keys * d; e += blockDim.x) {
        const int64_t j = e / d, c = e % d;
        A a = ak[e], b = av[e];
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t qi = base + (q_lo + i) * d + c;
          a += ds[i * tile + j] * load(q[qi]);
          b += pt[i * tile + j] * load(gout[qi]);
        }
        ak[e] = a;
        av[e] = b;
      }
      __syncthreads();
    }
    for (int64_t e = threadIdx.x; e < keys * d; e += blockDim.x) {
      gk[base + k_lo * d + e] = store<D>(scale * ak[e]);
      gv[base + k_lo * d + e] = store<D>(av[e]);
    }
    __syncthreads();
  }
}

dim3 tile_grid(int64_t bh, int64_t t, int64_t tile) {
  return dim3(static_cast<unsigned int>((t + tile - 1) / tile),
              static_cast<unsigned int>(std::min(bh, kMaxGrid)));
}

}  // namespace

template <>
template <class T>
void CausalAttention<Cuda>::forward(const T* q, const T* k, const T* v, int64_t bh, int64_t t,
                                    int64_t d, double scale, double dropout_p, uint64_t seed,
                                    philox::Offset offset, T* out, AttentionAcc<T>* lse,
                                    Ctx ctx) {
  using D = device_t<T>;
  using A = compute_t<D>;
  static_assert(std::is_same_v<A, AttentionAcc<T>>);
  detail::check_attention_sizes("causal_attention", bh, t, d, scale, dropout_p);
  if (bh == 0 || t == 0) return;
  const int64_t tile = tile_for(d, sizeof(A));
  const int64_t shared = (3 * tile * d + tile * tile + 3 * tile) * int64_t(sizeof(A));
  RG_LAUNCH(forward_kernel<D>, tile_grid(bh, t, tile), kThreads, static_cast<size_t>(shared),
            as_stream(ctx.stream), dev(q), dev(k), dev(v), bh, t, d, tile, static_cast<A>(scale),
            drop_mask<A>(dropout_p, seed, offset), dev(out), lse);
}

template <>
int64_t CausalAttention<Cuda>::backward_workspace_bytes(int64_t bh, int64_t t) {
  return std::max<int64_t>(bh * t, 1) * static_cast<int64_t>(sizeof(double));
}

template <>
template <class T>
void CausalAttention<Cuda>::backward(const T* gout, const T* q, const T* k, const T* v,
                                     const T* out, const AttentionAcc<T>* lse, int64_t bh,
                                     int64_t t, int64_t d, double scale, double dropout_p,
                                     uint64_t seed, philox::Offset offset, T* gq, T* gk, T* gv,
                                     Workspace workspace, Ctx ctx) {
  using D = device_t<T>;
  using A = compute_t<D>;
  detail::check_attention_sizes("causal_attention_backward", bh, t, d, scale, dropout_p);
  if (bh == 0 || t == 0) return;
  RG_ASSERT(workspace.data != nullptr && workspace.bytes >= backward_workspace_bytes(bh, t),
            "causal_attention_backward: needs a workspace of ", backward_workspace_bytes(bh, t),
            " bytes, got ", workspace.bytes);
  A* delta = static_cast<A*>(workspace.data);
  const auto stream = as_stream(ctx.stream);
  const int64_t rows = bh * t;
  RG_LAUNCH(delta_kernel<D>, static_cast<unsigned int>((rows + kThreads - 1) / kThreads), kThreads,
            0, stream, dev(gout), dev(out), rows, d, delta);
  const int64_t tile = tile_for(d, sizeof(A));
  const A sc = static_cast<A>(scale);
  const DropMask<A> mask = drop_mask<A>(dropout_p, seed, offset);
  const int64_t q_shared = (3 * tile * d + tile * tile) * int64_t(sizeof(A));
  RG_LAUNCH(query_grad_kernel<D>, tile_grid(bh, t, tile), kThreads, static_cast<size_t>(q_shared),
            stream, dev(gout), dev(q), dev(k), dev(v), lse, delta, bh, t, d, tile, sc, mask,
            dev(gq));
  const int64_t kv_shared = (4 * tile * d + 2 * tile * tile) * int64_t(sizeof(A));
  RG_LAUNCH(key_value_grad_kernel<D>, tile_grid(bh, t, tile), kThreads,
            static_cast<size_t>(kv_shared), stream, dev(gout), dev(q), dev(k), dev(v), lse, delta,
            bh, t, d, tile, sc, mask, dev(gk), dev(gv));
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_attention_kernels() {
  using K = CausalAttention<Cuda>;
  return std::tuple{&K::forward<T>, &K::backward<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_attention_kernels)

}  // namespace rg::kernels
