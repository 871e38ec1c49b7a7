// CUDA fill and dtype casts on device arrays: the device side of Tensor::fill_ and
// Tensor::to(dtype), bit-identical with kernels/cpu/cast.h (f16/bf16 round to nearest even; f64 ->
// f16/bf16 goes through f32, as on the CPU). Plain C++ header: `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

namespace rg::kernels::cuda {

// out[i] = value for i < n: float, double, Half, BFloat16, int64_t, int32_t, uint8_t.
template <class T>
void fill(T* out, T value, int64_t n, void* stream);

// dst[i] = convert<To>(src[i]) for i < n: every pair of the seven storage types. Floating values
// truncate toward zero into an integer type; into u8 they go through int64 and wrap, as in
// PyTorch (-1.0 -> 255). A value outside int64 (or the signed target's range), or NaN, gives an
// unspecified value. Integers narrow modulo 2^bits.
template <class From, class To>
void cast(const From* src, To* dst, int64_t n, void* stream);

}  // namespace rg::kernels::cuda
