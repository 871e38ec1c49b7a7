// The embedding kernels, one contract for both backends (kernels/backend.h): a row gather from a
// [v, d] table by n i64 indices, and its backward, which adds the gradient rows of equal indices
// into the table's gradient. kernels/cpu/embedding.cpp defines Embedding<Cpu> (f32, f64),
// kernels/cuda/embedding.cu Embedding<Cuda> (f32, f64, f16, bf16); every pointer is on the
// backend's device.
//
// Shared rules:
//   - Indices are not trusted: an index outside [0, v) is never read through. Its output row is
//     NaN, and first_bad (two i64) receives the smallest such position and its index, or n and 0
//     when every index is in range; the caller turns that into an error (engine/ops/embedding.cpp
//     does, on both devices).
//   - The backward is deterministic on both backends and the same bits on both for f32 and f64:
//     each element of a row's gradient is the sum of the gradient rows of that row's indices in
//     increasing position order, in the compute type (f64 for f64, f32 otherwise), rounded once to
//     T. No float atomics. Rows nothing points at, the padding row (padding_idx in [0, v); -1 for
//     none) and indices out of range contribute or receive nothing, so such rows are zero.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

template <class B>
struct Embedding {
  // out[i, :] = weight[indices[i], :] for i in [0, n), rows of d values; first_bad[0..1] as above.
  template <class T>
  static void embedding(const T* weight, const int64_t* indices, T* out, int64_t* first_bad,
                        int64_t n, int64_t v, int64_t d, Ctx ctx);

  // Scratch bytes embedding_backward needs for a [v, d] table of T (the compute-type sums where
  // T is narrower than its compute type).
  template <class T>
  static int64_t embedding_backward_workspace_bytes(int64_t v, int64_t d);
  // grad_weight[r, :] = sum over i with indices[i] == r != padding_idx of grad[i, :] (all of
  // grad_weight is written).
  template <class T>
  static void embedding_backward(const T* grad, const int64_t* indices, T* grad_weight, int64_t n,
                                 int64_t v, int64_t d, int64_t padding_idx, Workspace workspace,
                                 Ctx ctx);
};

namespace detail {

// The size checks both backends make before touching memory.
inline void check_embedding_sizes(const char* op, int64_t n, int64_t v, int64_t d) {
  RG_CHECK(n >= 0 && v >= 0 && d >= 0, op, ": sizes must be non-negative, got n ", n, ", v ", v,
           ", d ", d);
}
inline void check_padding_idx(const char* op, int64_t padding_idx, int64_t v) {
  RG_CHECK(padding_idx == -1 || (padding_idx >= 0 && padding_idx < v), op, ": padding_idx ",
           padding_idx, " is out of range for ", v, " embeddings (-1 for none)");
}

}  // namespace detail
}  // namespace rg::kernels
