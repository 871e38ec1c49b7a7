// Sum and mean reductions, one contract for both backends (kernels/backend.h), on arrays viewed
// as (outer, r, inner): out[o, i] = sum_k in[o, k, i] (reducing several dimensions is a sequence
// of calls, or one when they are adjacent), and over all n elements. kernels/cpu/reduce.cpp
// defines Reduce<Cpu> (f32, f64), kernels/cuda/reduce.cu Reduce<Cuda> (f32, f64, f16, bf16).
//
// Shared rules: every sum accumulates in f64 (reductions are memory-bound, so this costs no
// time, and a sum of many small values next to a large one keeps them), and the mean's 1 / r is
// applied in f64 before the single rounding to T. Results are deterministic: the order of the
// additions depends on the sizes only, never on the thread count or timing. sum_all splits the n
// elements into sum_all_partials(n) contiguous chunks, whose f64 sums go to the workspace and are
// added in a fixed order. A sum over nothing is 0; a mean over nothing is NaN (PyTorch's).
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

template <class B>
struct Reduce {
  // out[o, i] = sum_k in[o, k, i]
  template <class T>
  static void sum_dim(const T* in, T* out, int64_t outer, int64_t r, int64_t inner, Ctx ctx);
  // out[o, i] = sum_k in[o, k, i] / r
  template <class T>
  static void mean_dim(const T* in, T* out, int64_t outer, int64_t r, int64_t inner, Ctx ctx);

  // The chunks sum_all adds separately: one per kSumAllChunk elements, at most kMaxSumAllPartials.
  static constexpr int64_t kSumAllChunk = 8192;
  static constexpr int64_t kMaxSumAllPartials = 1024;
  static int64_t sum_all_partials(int64_t n) {
    const int64_t p = (n + kSumAllChunk - 1) / kSumAllChunk;
    return p < 1 ? 1 : (p > kMaxSumAllPartials ? kMaxSumAllPartials : p);
  }
  // Scratch bytes sum_all / mean_all need for n elements (the f64 partial sums).
  static int64_t sum_all_workspace_bytes(int64_t n) {
    return sum_all_partials(n) * static_cast<int64_t>(sizeof(double));
  }
  // out[0] = sum of the n elements (one element of T on the device)
  template <class T>
  static void sum_all(const T* in, int64_t n, T* out, Workspace workspace, Ctx ctx);
  // out[0] = sum / n
  template <class T>
  static void mean_all(const T* in, int64_t n, T* out, Workspace workspace, Ctx ctx);
};

namespace detail {

inline void check_reduce_sizes(const char* op, int64_t outer, int64_t r, int64_t inner) {
  RG_CHECK(outer >= 0 && r >= 0 && inner >= 0, op, ": sizes must be non-negative, got outer ",
           outer, ", r ", r, ", inner ", inner);
}

}  // namespace detail
}  // namespace rg::kernels
