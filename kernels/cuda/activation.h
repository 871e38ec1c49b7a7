// CUDA activations, forward and the fused backward of each: the kernels/cpu/activation.h
// functions on device arrays, with the same formulas (PyTorch's). Plain C++ header: `stream` is a
// cudaStream_t; instantiated for float, double, Half and BFloat16 (f16/bf16 compute in f32).
#pragma once

#include <cstdint>

namespace rg::kernels::cuda {

// out[i] = max(x[i], 0) (NaN propagates); backward from the output: grad * (out > 0).
template <class T>
void relu(const T* x, T* out, int64_t n, void* stream);
template <class T>
void relu_backward(const T* grad, const T* out, T* grad_in, int64_t n, void* stream);

// out[i] = x[i] > 0 ? x[i] : x[i] * negative_slope; backward from the input.
template <class T>
void leaky_relu(const T* x, T* out, int64_t n, double negative_slope, void* stream);
template <class T>
void leaky_relu_backward(const T* grad, const T* x, T* grad_in, int64_t n, double negative_slope,
                         void* stream);

// Exact x * Phi(x), or PyTorch's tanh approximation; backward from the input.
template <class T>
void gelu(const T* x, T* out, int64_t n, bool approximate, void* stream);
template <class T>
void gelu_backward(const T* grad, const T* x, T* grad_in, int64_t n, bool approximate,
                   void* stream);

// out[i] = 1 / (1 + exp(-x[i])); backward from the output: grad * out * (1 - out).
template <class T>
void sigmoid(const T* x, T* out, int64_t n, void* stream);
template <class T>
void sigmoid_backward(const T* grad, const T* out, T* grad_in, int64_t n, void* stream);

// out[i] = tanh(x[i]); backward from the output: grad * (1 - out^2).
template <class T>
void tanh(const T* x, T* out, int64_t n, void* stream);
template <class T>
void tanh_backward(const T* grad, const T* out, T* grad_in, int64_t n, void* stream);

}  // namespace rg::kernels::cuda
