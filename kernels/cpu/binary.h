// Elementwise binary arithmetic on raw arrays: same shape, tensor-scalar, and strided broadcast.
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

enum class BinaryOp : uint8_t { add, sub, mul, div };

// out[i] = a[i] op b[i]
template <class T>
void binary(BinaryOp op, const T* a, const T* b, T* out, int64_t n);
// out[i] = a[i] op s   (or s op a[i] when scalar_first)
template <class T>
void binary_scalar(BinaryOp op, const T* a, T s, T* out, int64_t n, bool scalar_first);
// out (contiguous, out_shape) = a op b where a and b are read through element strides that are
// 0 along broadcast dimensions.
template <class T>
void binary_broadcast(BinaryOp op, const T* a, const int64_t* a_strides, const T* b,
                      const int64_t* b_strides, T* out, const int64_t* out_shape, int ndim);
// out[i] += alpha * x[i]
template <class T>
void axpy(T alpha, const T* x, T* out, int64_t n);

}  // namespace rg::kernels::cpu
