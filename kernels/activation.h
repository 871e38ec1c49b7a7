// The activation kernels, one contract for both backends (kernels/backend.h): relu, leaky_relu,
// gelu (exact or PyTorch's tanh form), sigmoid and tanh on n contiguous values, each with a fused
// backward (one read of the gradient and one of the saved tensor). kernels/cpu/activation.cpp
// defines Activation<Cpu> (f32, f64), kernels/cuda/activation.cu Activation<Cuda> (f32, f64, f16,
// bf16); every pointer is on the backend's device.
//
// Shared rules: every formula is PyTorch's, evaluated per element in the compute type (f64 for
// f64, f32 otherwise) and rounded once to T; scalar parameters (negative_slope) are rounded to the
// compute type first. relu and leaky_relu are exact, so both backends give the same bits, signed
// zeros and NaN included (NaN propagates, as in PyTorch); the transcendental ones (erf, exp,
// tanh) agree up to the rounding of each backend's math library.
#pragma once

#include <cstdint>
#include <numbers>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

template <class B>
struct Activation {
  // out[i] = x[i] < 0 ? 0 : x[i]
  template <class T>
  static void relu(const T* x, T* out, int64_t n, Ctx ctx);
  // grad_in[i] = out[i] > 0 ? grad[i] : 0, from the forward's output.
  template <class T>
  static void relu_backward(const T* grad, const T* out, T* grad_in, int64_t n, Ctx ctx);

  // out[i] = x[i] * (x[i] > 0 ? 1 : negative_slope): x[i] itself when positive, so NaN stays
  // NaN and a zero keeps the sign that x[i] * negative_slope gives it.
  template <class T>
  static void leaky_relu(const T* x, T* out, int64_t n, double negative_slope, Ctx ctx);
  // grad_in[i] = grad[i] * (x[i] > 0 ? 1 : negative_slope), from the forward's input (the slope
  // may be negative, so the output's sign says nothing).
  template <class T>
  static void leaky_relu_backward(const T* grad, const T* x, T* grad_in, int64_t n,
                                  double negative_slope, Ctx ctx);

  // Exact: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); approximate: PyTorch's tanh form
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  template <class T>
  static void gelu(const T* x, T* out, int64_t n, bool approximate, Ctx ctx);
  // From the forward's input: grad * d/dx of the chosen form.
  template <class T>
  static void gelu_backward(const T* grad, const T* x, T* grad_in, int64_t n, bool approximate,
                            Ctx ctx);

  // out[i] = 1 / (1 + exp(-x[i])) (0 where exp overflows).
  template <class T>
  static void sigmoid(const T* x, T* out, int64_t n, Ctx ctx);
  // grad_in[i] = grad[i] * out[i] * (1 - out[i]), from the forward's output.
  template <class T>
  static void sigmoid_backward(const T* grad, const T* out, T* grad_in, int64_t n, Ctx ctx);

  // out[i] = tanh(x[i])
  template <class T>
  static void tanh(const T* x, T* out, int64_t n, Ctx ctx);
  // grad_in[i] = grad[i] * (1 - out[i]^2), from the forward's output.
  template <class T>
  static void tanh_backward(const T* grad, const T* out, T* grad_in, int64_t n, Ctx ctx);
};

namespace detail {

// Whether there is anything to do; throws for a negative count (both backends).
inline bool check_activation_size(const char* op, int64_t n) {
  RG_CHECK(n >= 0, op, ": element count must be >= 0, got ", n);
  return n > 0;
}

// PyTorch's GELU constants, the same on both backends (rounded to the compute type where used).
inline constexpr double kGeluSqrt1_2 = 1.0 / std::numbers::sqrt2;  // 1/sqrt(2)
inline constexpr double kGeluInvSqrt2Pi =
    std::numbers::inv_sqrtpi / std::numbers::sqrt2;  // 1/sqrt(2 pi)
inline constexpr double kGeluSqrt2OverPi =
    std::numbers::sqrt2 * std::numbers::inv_sqrtpi;  // sqrt(2/pi)
inline constexpr double kGeluKappa = 0.044715;

}  // namespace detail
}  // namespace rg::kernels
