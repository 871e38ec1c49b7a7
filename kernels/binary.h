// Elementwise binary arithmetic, one contract for both backends (kernels/backend.h): same shape,
// tensor-scalar, per-channel and bias broadcast, general strided broadcast, and axpy.
// kernels/cpu/binary.cpp defines Binary<Cpu> (f32, f64), kernels/cuda/binary.cu Binary<Cuda>
// (f32, f64, f16, bf16; the half types compute in f32 and round once). Scalars come in f64 and
// are used in the compute type (f64 for f64, f32 otherwise), so a scalar is never rounded to a
// half type first.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/unary.h"

namespace rg::kernels {

enum class BinaryOp : uint8_t { add, sub, mul, div };

// The most dimensions binary_broadcast takes.
inline constexpr int kMaxBroadcastDims = 8;

template <class B>
struct Binary {
  // out[i] = a[i] op b[i]
  template <class T>
  static void binary(BinaryOp op, const T* a, const T* b, T* out, int64_t n, Ctx ctx);
  // out[i] = a[i] op s   (or s op a[i] when scalar_first)
  template <class T>
  static void binary_scalar(BinaryOp op, const T* a, double s, T* out, int64_t n, bool scalar_first,
                            Ctx ctx);
  // a is contiguous [outer, channels, inner] (NCHW: outer = N, inner = H*W) and b is [channels]:
  // out[o, c, i] = a[o, c, i] op b[c]   (or b[c] op a[o, c, i] when b_first).
  template <class T>
  static void binary_per_channel(BinaryOp op, const T* a, const T* b, T* out, int64_t outer,
                                 int64_t channels, int64_t inner, bool b_first, Ctx ctx);
  // General broadcasting: out (contiguous, out_shape) = a op b with a and b read through element
  // strides that are 0 along broadcast dimensions; ndim <= kMaxBroadcastDims. The shape and
  // strides are host arrays.
  template <class T>
  static void binary_broadcast(BinaryOp op, const T* a, const int64_t* a_strides, const T* b,
                               const int64_t* b_strides, T* out, const int64_t* out_shape, int ndim,
                               Ctx ctx);
  // out[i] += alpha * x[i]   (alpha in the compute type)
  template <class T>
  static void axpy(double alpha, const T* x, T* out, int64_t n, Ctx ctx);
};

namespace detail {

inline void check_per_channel(int64_t outer, int64_t channels, int64_t inner) {
  RG_CHECK(outer >= 0 && channels >= 0 && inner >= 0,
           "binary_per_channel: sizes must be >= 0, got outer ", outer, ", channels ", channels,
           ", inner ", inner);
}
inline void check_broadcast(const char* op, int ndim, const int64_t* out_shape) {
  RG_CHECK(ndim >= 0 && ndim <= kMaxBroadcastDims, op, ": ", ndim, " dimensions, at most ",
           kMaxBroadcastDims, " are supported");
  for (int d = 0; d < ndim; ++d) RG_CHECK(out_shape[d] >= 0, op, ": negative size ", out_shape[d]);
}

}  // namespace detail
}  // namespace rg::kernels
