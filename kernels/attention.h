// The causal self-attention kernels, one contract for both backends (kernels/backend.h), on
// arrays viewed as [bh, t, d] (batch * heads, sequence, head size), contiguous:
//   out[r, i] = sum_{j <= i} P[r, i, j] v[r, j],  P = softmax_j(scale * q[r, i] . k[r, j]), j <= i.
// The forward keeps the per-row log-sum-exp of the scaled scores over the allowed keys, so the
// backward recomputes P from it (FlashAttention's scheme): CUDA never stores more than a tile of
// P, the CPU a block of 64 query rows by the keys they see, per worker.
// kernels/cpu/attention.cpp defines CausalAttention<Cpu> (f32, f64), kernels/cuda/attention.cu
// CausalAttention<Cuda> (f32, f64, f16, bf16).
//
// Shared rules: scores, sums and gradients accumulate in AttentionAcc<T> (f64 for f64, f32
// otherwise); every output element is written by one thread in an order fixed by the shape (no
// atomics), so results do not depend on the thread count or timing.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

template <class T>
using AttentionAcc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class B>
struct CausalAttention {
  // out as above and lse[r * t + i] = log sum_{j <= i} exp(scale * q[r, i] . k[r, j]).
  template <class T>
  static void forward(const T* q, const T* k, const T* v, int64_t bh, int64_t t, int64_t d,
                      double scale, T* out, AttentionAcc<T>* lse, Ctx ctx);
  // Scratch bytes backward needs (CUDA: the per-row delta = rowsum(gout * out)).
  static int64_t backward_workspace_bytes(int64_t bh, int64_t t);
  // With P recomputed from lse, delta_i = gout_i . out_i and dS_ij = P_ij (gout_i . v_j - delta_i):
  //   gv_j = sum_{i >= j} P_ij gout_i,  gq_i = scale sum_{j <= i} dS_ij k_j,
  //   gk_j = scale sum_{i >= j} dS_ij q_i.   (all three non-null)
  template <class T>
  static void backward(const T* gout, const T* q, const T* k, const T* v, const T* out,
                       const AttentionAcc<T>* lse, int64_t bh, int64_t t, int64_t d, double scale,
                       T* gq, T* gk, T* gv, Workspace workspace, Ctx ctx);
};

namespace detail {

inline void check_attention_sizes(const char* op, int64_t bh, int64_t t, int64_t d, double scale) {
  RG_CHECK(bh >= 0 && t >= 0 && d >= 0, op, ": sizes must be non-negative, got bh ", bh, ", t ", t,
           ", d ", d);
  RG_CHECK(scale > 0, op, ": scale must be positive, got ", scale);
}

}  // namespace detail
}  // namespace rg::kernels
