// CUDA evaluation metrics on device arrays, with kernels/cpu/metrics.h's contract: argmax along a
// dimension and top-k hit counts (accuracy = count / n). Plain C++ header: `stream` is a
// cudaStream_t.
#pragma once

#include <cstdint>

namespace rg::kernels::cuda {

// Instantiated for float, double, Half and BFloat16 (compared in f32 for the half types). NaN
// counts as the largest value and ties go to the lowest index, like torch.argmax.

// out[o, i] = the index k < c of the largest x[o, k, i] (input viewed as (outer, c, inner), c > 0).
template <class T>
void argmax(const T* x, int64_t* out, int64_t outer, int64_t c, int64_t inner, void* stream);

// counts[0] = the number of rows of logits [n, c] whose target (i64 [n]) is in [0, c) and among
// the k largest values, ties ranked by index so exactly k classes are "in the top k"
// (1 <= k <= c); counts[1] = the first row whose target is outside [0, c), or n when none (device
// i64 [2]). Integer atomics across blocks: deterministic.
template <class T>
void topk_correct(const T* logits, const int64_t* target, int64_t n, int64_t c, int64_t k,
                  int64_t* counts, void* stream);

}  // namespace rg::kernels::cuda
