// CUDA dropout with Philox (kernels/philox.h): for the same seed and offset the mask is the CPU's
// (kernels/cpu/random.h dropout_mask) bit for bit, so a run can move between devices. Plain C++
// header: `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

namespace rg::kernels::cuda {

// Instantiated for float, double, Half and BFloat16 (f16/bf16 multiply in f32, round once).
// Element i keeps with probability 1 - p using word i % 4 of Philox block (offset + i / 4), so a
// call consumes (n + 3) / 4 counters; `scale` is usually 1 / (1 - p).

// mask[i] = (u_i >= p) ? scale : 0, as cpu::dropout_mask.
template <class T>
void dropout_mask(T* mask, int64_t n, double p, T scale, uint64_t seed, uint64_t offset,
                  void* stream);
// The fused forward: mask as above (kept for the backward) and out[i] = x[i] * mask[i].
template <class T>
void dropout_forward(const T* x, T* out, T* mask, int64_t n, double p, T scale, uint64_t seed,
                     uint64_t offset, void* stream);
// grad_in[i] = grad[i] * mask[i].
template <class T>
void dropout_backward(const T* grad, const T* mask, T* grad_in, int64_t n, void* stream);

}  // namespace rg::kernels::cuda
