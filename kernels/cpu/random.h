// Philox-based fills on the CPU (random tensors on CUDA are drawn here and copied; dropout's masks
// are kernels/dropout.h's, drawn on each device with the same bits). Element i of a fill starting at counter `offset` uses word i%4 of
// counter offset + i/4 (uniform) or words (2i)%4, (2i+1)%4 of counter offset + i/2 (normal).
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

template <class T>
void uniform(T* out, int64_t n, T low, T high, uint64_t seed, uint64_t offset);
template <class T>
void normal(T* out, int64_t n, T mean, T stddev, uint64_t seed, uint64_t offset);

}  // namespace rg::kernels::cpu
