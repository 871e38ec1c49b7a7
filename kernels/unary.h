// Elementwise unary math, one contract for both backends (kernels/backend.h): forward only (the
// engine composes the derivatives). kernels/cpu/unary.cpp defines Unary<Cpu> (f32, f64),
// kernels/cuda/unary.cu Unary<Cuda> (f32, f64, f16, bf16; the half types compute in f32 and round
// once). Scalars come in f64 and are used in the compute type.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

enum class UnaryOp : uint8_t { neg, exp, log, sqrt };

template <class B>
struct Unary {
  // out[i] = op(x[i])
  template <class T>
  static void unary(UnaryOp op, const T* x, T* out, int64_t n, Ctx ctx);
  // out[i] = x[i] ^ p (p == 2 squares and p == 1 copies, exactly, on both backends)
  template <class T>
  static void pow_scalar(const T* x, double p, T* out, int64_t n, Ctx ctx);
};

namespace detail {

inline void check_elementwise_size(const char* op, int64_t n) {
  RG_CHECK(n >= 0, op, ": element count must be >= 0, got ", n);
}

}  // namespace detail
}  // namespace rg::kernels
