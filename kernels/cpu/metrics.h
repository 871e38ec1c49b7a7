// CPU evaluation metrics on raw arrays, with kernels/cuda/metrics.h's contract: argmax along a
// dimension and top-k hit counts (the engine's metrics ops call one or the other).
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

// Instantiated for float and double. NaN counts as the largest value and ties go to the lowest
// index, like torch.argmax.

// out[o, i] = the index k < c of the largest x[o, k, i] (input viewed as (outer, c, inner), c > 0).
template <class T>
void argmax(const T* x, int64_t* out, int64_t outer, int64_t c, int64_t inner);

// counts[0] = the number of rows of logits [n, c] whose target (i64 [n]) is in [0, c) and among
// the k largest values, ties ranked by index so exactly k classes are "in the top k"
// (1 <= k <= c); counts[1] = the first row whose target is outside [0, c), or n when none. The
// engine decides what a bad target means (an error on every device).
template <class T>
void topk_correct(const T* logits, const int64_t* target, int64_t n, int64_t c, int64_t k,
                  int64_t* counts);

}  // namespace rg::kernels::cpu
