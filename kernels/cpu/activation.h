// Activation functions on raw arrays: forward and a fused backward per activation, so that a
// backward pass costs one read of the gradient and one of the saved tensor.
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

// out[i] = max(x[i], 0) (NaN propagates, like PyTorch).
template <class T>
void relu(const T* x, T* out, int64_t n);
// grad_in[i] = grad[i] * (out[i] > 0), from the forward's output.
template <class T>
void relu_backward(const T* grad, const T* out, T* grad_in, int64_t n);

// out[i] = x[i] > 0 ? x[i] : x[i] * negative_slope
template <class T>
void leaky_relu(const T* x, T* out, int64_t n, T negative_slope);
// From the forward's input: the slope may be negative, so the output's sign says nothing.
template <class T>
void leaky_relu_backward(const T* grad, const T* x, T* grad_in, int64_t n, T negative_slope);

// Exact: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); approximate: PyTorch's tanh form
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class T>
void gelu(const T* x, T* out, int64_t n, bool approximate);
template <class T>
void gelu_backward(const T* grad, const T* x, T* grad_in, int64_t n, bool approximate);

// out[i] = 1 / (1 + exp(-x[i])); backward from the output: grad * out * (1 - out).
template <class T>
void sigmoid(const T* x, T* out, int64_t n);
template <class T>
void sigmoid_backward(const T* grad, const T* out, T* grad_in, int64_t n);

// out[i] = tanh(x[i]); backward from the output: grad * (1 - out^2).
template <class T>
void tanh(const T* x, T* out, int64_t n);
template <class T>
void tanh_backward(const T* grad, const T* out, T* grad_in, int64_t n);

}  // namespace rg::kernels::cpu
