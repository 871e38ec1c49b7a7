// Layer normalization over the last dimension, with PyTorch's semantics
// (F.layer_norm(x, normalized_shape=[D], weight, bias, eps)).
#pragma once

#include "engine/tensor.h"

namespace rg {

// x [..., D] (at least 1-d): each row of D values becomes (x - mean) / sqrt(var + eps) * weight +
// bias, with the row's mean and biased variance; weight and bias are [D] or undefined (1 and 0).
// Under autocast it runs in f32, as PyTorch's (its fp32 list); f16/bf16 on the CPU compute in f32.
Tensor layer_norm(const Tensor& x, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);

}  // namespace rg
