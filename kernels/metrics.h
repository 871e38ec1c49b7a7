// The metrics kernels, one contract for both backends (kernels/backend.h): argmax along a
// dimension and top-k hit counts (the engine's argmax, topk_correct and accuracy call one or the
// other). kernels/cpu/metrics.cpp defines Metrics<Cpu> (f32, f64), kernels/cuda/metrics.cu
// Metrics<Cuda> (f32, f64, f16, bf16, compared in f32 for the half types); every pointer is on the
// backend's device.
//
// Shared rules: values are compared in the compute type (f64 for f64, f32 otherwise); NaN counts
// as the largest value and ties go to the lowest index, like torch.argmax, so the first NaN wins.
// No sort: a target is in the top k when fewer than k classes rank above it (equal classes rank
// by index). Targets are not trusted: a target outside [0, c) is never read through and is
// reported, as the loss kernels do; the engine decides what it means (an error on every device).
// Results are integers: they do not depend on the thread count or timing.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

template <class B>
struct Metrics {
  // out[o, i] = the index k < c of the largest x[o, k, i] (input viewed as (outer, c, inner),
  // c > 0).
  template <class T>
  static void argmax(const T* x, int64_t* out, int64_t outer, int64_t c, int64_t inner, Ctx ctx);

  // counts[0] = the number of rows of logits [n, c] whose target (i64 [n]) is in [0, c) and among
  // the k largest values, ties ranked by index so exactly k classes are "in the top k"
  // (1 <= k <= c); counts[1] = the first row whose target is outside [0, c), or n when none
  // (i64 [2] on the device).
  template <class T>
  static void topk_correct(const T* logits, const int64_t* target, int64_t n, int64_t c, int64_t k,
                           int64_t* counts, Ctx ctx);
};

namespace detail {

// The size checks both backends make before touching memory.
inline void check_argmax_sizes(int64_t outer, int64_t c, int64_t inner) {
  RG_CHECK(outer >= 0 && inner >= 0, "argmax: sizes must be non-negative, got outer ", outer,
           ", inner ", inner);
  RG_CHECK(c > 0, "argmax: cannot take the argmax of an empty dimension (c = ", c, ")");
}
inline void check_topk_sizes(int64_t n, int64_t c, int64_t k) {
  RG_CHECK(n >= 0 && c > 0, "topk_correct: needs n >= 0 rows of c > 0 classes, got n ", n, ", c ",
           c);
  RG_CHECK(k >= 1 && k <= c, "topk_correct: k = ", k, " must be in [1, ", c, "] for ", c,
           " classes");
}

}  // namespace detail
}  // namespace rg::kernels
