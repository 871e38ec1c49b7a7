// Activation functions: relu, leaky_relu, gelu (exact or tanh form), sigmoid, tanh, with
// PyTorch's formulas and fused backward kernels.
#pragma once

#include "engine/tensor.h"

namespace rg {

Tensor relu(const Tensor& x);
// The same, taking x over (x is left undefined): written over x's buffer when nothing else holds
// it (reusable() in engine/ops/check.h); relu's backward reads only its output.
Tensor relu(Tensor&& x);
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
// approximate=false: x * Phi(x) with erf; true: PyTorch's approximate='tanh'.
Tensor gelu(const Tensor& x, bool approximate = false);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);

}  // namespace rg
