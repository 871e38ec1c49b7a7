// The causal self-attention kernels, one contract for both backends (kernels/backend.h), on
// arrays viewed as [bh, t, d] (batch * heads, sequence, head size), contiguous:
//   out[r, i] = sum_{j <= i} P[r, i, j] v[r, j],  P = softmax_j(scale * q[r, i] . k[r, j]), j <= i.
// The forward keeps the per-row log-sum-exp of the scaled scores over the allowed keys, so the
// backward recomputes P from it (FlashAttention's scheme): CUDA never stores more than a tile of
// P, the CPU a block of 64 query rows by the keys they see, per worker.
// kernels/cpu/attention.cpp defines CausalAttention<Cpu> (f32, f64), kernels/cuda/attention.cu
// CausalAttention<Cuda> (f32, f64, f16, bf16).
//
// Dropout on the probabilities (FlashAttention's, F.scaled_dot_product_attention's dropout_p): with
// p > 0, out[r, i] = sum_{j <= i} P[r, i, j] M[r, i, j] v[r, j], where M is 0 (dropped) or
// 1 / (1 - p) (kept) and lse stays that of P. M is never stored: both backends regenerate it in
// forward and backward from (seed, offset) with attention_dropout_group's layout (each query row
// starts a new Philox counter, so a row's keys come four to a counter) and kernels/dropout.h's
// keep rule, so M[r, i, j] is the same bit on both devices. p = 0 runs the dropout-free code.
//
// Shared rules: scores, sums and gradients accumulate in AttentionAcc<T> (f64 for f64, f32
// otherwise); every output element is written by one thread in an order fixed by the shape (no
// atomics), so results do not depend on the thread count or timing.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/backend.h"
#include "kernels/error.h"
#include "kernels/philox.h"

namespace rg::kernels {

template <class T>
using AttentionAcc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class B>
struct CausalAttention {
  // out as above and lse[r * t + i] = log sum_{j <= i} exp(scale * q[r, i] . k[r, j]).
  template <class T>
  static void forward(const T* q, const T* k, const T* v, int64_t bh, int64_t t, int64_t d,
                      double scale, double dropout_p, uint64_t seed, philox::Offset offset,
                      T* out, AttentionAcc<T>* lse, Ctx ctx);
  // Scratch bytes backward needs (CUDA: the per-row delta = rowsum(gout * out)).
  static int64_t backward_workspace_bytes(int64_t bh, int64_t t);
  // With P recomputed from lse (and M regenerated: the forward's dropout_p, seed and offset),
  // delta_i = gout_i . out_i and dS_ij = P_ij (M_ij gout_i . v_j - delta_i):
  //   gv_j = sum_{i >= j} P_ij M_ij gout_i,  gq_i = scale sum_{j <= i} dS_ij k_j,
  //   gk_j = scale sum_{i >= j} dS_ij q_i.   (all three non-null)
  template <class T>
  static void backward(const T* gout, const T* q, const T* k, const T* v, const T* out,
                       const AttentionAcc<T>* lse, int64_t bh, int64_t t, int64_t d, double scale,
                       double dropout_p, uint64_t seed, philox::Offset offset, T* gq, T* gk,
                       T* gv, Workspace workspace, Ctx ctx);
};

namespace detail {

inline void check_attention_sizes(const char* op, int64_t bh, int64_t t, int64_t d, double scale,
                                  double dropout_p) {
  RG_CHECK(bh >= 0 && t >= 0 && d >= 0, op, ": sizes must be non-negative, got bh ", bh, ", t ", t,
           ", d ", d);
  RG_CHECK(scale > 0, op, ": scale must be positive, got ", scale);
  RG_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, op, ": dropout_p must be in [0, 1), got ",
           dropout_p);
}

}  // namespace detail

// The dropout mask's layout: M[r, i, j] comes from word j % 4 of Philox counter
// attention_dropout_group(offset, r, i, j, t) = offset + (r * t + i) * ceil(t / 4) + j / 4, kept
// when (word >> 8) >= dropout_keep_threshold(p) (kernels/dropout.h). A call with bh heads of t
// positions uses attention_dropout_groups(bh, t) counters from offset on.
RG_HOST_DEVICE inline uint64_t attention_dropout_group(uint64_t offset, int64_t r, int64_t i,
                                                       int64_t j, int64_t t) {
  return offset + uint64_t(r * t + i) * uint64_t((t + 3) / 4) + uint64_t(j / 4);
}
inline uint64_t attention_dropout_groups(int64_t bh, int64_t t) {
  return uint64_t(bh) * uint64_t(t) * uint64_t((t + 3) / 4);
}

}  // namespace rg::kernels
