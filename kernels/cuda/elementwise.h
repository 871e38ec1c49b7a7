// CUDA elementwise unary math and binary arithmetic (same shape, tensor-scalar, per-channel and
// bias broadcast): the kernels/cpu/unary.h and binary.h operations on device arrays.
// Plain C++ header: `stream` is a cudaStream_t; f16/bf16 compute in f32 and round once.
#pragma once

#include <cstdint>

#include "kernels/cpu/binary.h"
#include "kernels/cpu/unary.h"

namespace rg::kernels::cuda {

using cpu::BinaryOp;
using cpu::UnaryOp;

// Instantiated for float, double, Half and BFloat16. Scalars are taken in f64 and used in the
// compute type (f32 for the half types), so a scalar is never rounded to f16/bf16 first.

// out[i] = op(x[i])
template <class T>
void unary(UnaryOp op, const T* x, T* out, int64_t n, void* stream);
// out[i] = x[i] ^ p
template <class T>
void pow_scalar(const T* x, double p, T* out, int64_t n, void* stream);

// out[i] = a[i] op b[i]
template <class T>
void binary(BinaryOp op, const T* a, const T* b, T* out, int64_t n, void* stream);
// out[i] = a[i] op s   (or s op a[i] when scalar_first)
template <class T>
void binary_scalar(BinaryOp op, const T* a, double s, T* out, int64_t n, bool scalar_first,
                   void* stream);
// a is contiguous [outer, channels, inner] (NCHW: outer = N, inner = H*W) and b is [channels]:
// out[o, c, i] = a[o, c, i] op b[c]   (or b[c] op a[o, c, i] when b_first).
template <class T>
void binary_per_channel(BinaryOp op, const T* a, const T* b, T* out, int64_t outer,
                        int64_t channels, int64_t inner, bool b_first, void* stream);
// The bias form, inner = 1: a is [rows, cols] and b is [cols]: out[r, j] = a[r, j] op b[j]
// (or b[j] op a[r, j] when b_first).
template <class T>
void binary_bias(BinaryOp op, const T* a, const T* b, T* out, int64_t rows, int64_t cols,
                 bool b_first, void* stream);

// General broadcasting, as cpu::binary_broadcast: out (contiguous, out_shape) = a op b with a and
// b read through element strides that are 0 along broadcast dimensions; ndim <= 8. Host arrays.
inline constexpr int kMaxBroadcastDims = 8;
template <class T>
void binary_broadcast(BinaryOp op, const T* a, const int64_t* a_strides, const T* b,
                      const int64_t* b_strides, T* out, const int64_t* out_shape, int ndim,
                      void* stream);

// out[i] += alpha * x[i]   (alpha in the compute type)
template <class T>
void axpy(double alpha, const T* x, T* out, int64_t n, void* stream);

}  // namespace rg::kernels::cuda
