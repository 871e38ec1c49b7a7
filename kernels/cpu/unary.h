// Elementwise unary math on raw arrays (forward only; backward is composed in the engine).
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

enum class UnaryOp : uint8_t { neg, exp, log, sqrt };

// out[i] = op(x[i])
template <class T>
void unary(UnaryOp op, const T* x, T* out, int64_t n);
// out[i] = x[i] ^ p
template <class T>
void pow_scalar(const T* x, T p, T* out, int64_t n);

}  // namespace rg::kernels::cpu
