// CUDA fused optimizer steps (SGD with momentum/dampening/Nesterov/weight decay, Adam and AdamW):
// one pass per element with the formulas of kernels/cpu/optim.h (PyTorch's). Plain C++ header:
// `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

#include "kernels/cpu/optim.h"

namespace rg::kernels::cuda {

using cpu::AdamParams;
using cpu::SgdParams;

// Instantiated for float, double, Half and BFloat16: parameters, gradients and state share one
// type; f16/bf16 compute in f32 and round each stored value once. Hyperparameters are converted
// to the compute type on the host exactly as the CPU kernel does.

// See cpu::sgd_step. `buf` may be null when momentum == 0.
template <class T>
void sgd_step(T* p, const T* g, T* buf, int64_t n, const SgdParams& params, bool first_step,
              void* stream);

// See cpu::adam_step: step number `step` (>= 1) with bias correction.
template <class T>
void adam_step(T* p, const T* g, T* m, T* v, int64_t n, const AdamParams& params, int64_t step,
               void* stream);

}  // namespace rg::kernels::cuda
