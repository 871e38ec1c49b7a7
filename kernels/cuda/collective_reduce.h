// The CUDA reduction step of collectives (our ring all-reduce's reduce-scatter, and the average's
// division): kernels/cpu/collective_reduce.h on device arrays, with the same results. Plain C++
// header: `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

#include "kernels/cpu/collective_reduce.h"

namespace rg::kernels::cuda {

using cpu::CollectiveOp;

// out[i] = a[i] op b[i]; out may alias a or b. f16/bf16 compute in f32 and round once per step;
// max/min pick like std::max/std::min (a NaN in `a` wins, a NaN in `b` loses), as on the CPU.
// Instantiated for float, double, Half, BFloat16, int64_t, int32_t and uint8_t.
template <class T>
void collective_reduce(CollectiveOp op, T* out, const T* a, const T* b, int64_t n, void* stream);

// x[i] /= divisor (integers truncate toward zero like NCCL's ncclAvg); divisor must be > 0.
template <class T>
void divide_by(T* x, int64_t n, int64_t divisor, void* stream);

}  // namespace rg::kernels::cuda
