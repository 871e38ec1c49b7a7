// Batch normalization over the channel dimension of [N, C] or [N, C, H, W] tensors, with
// PyTorch's semantics (F.batch_norm).
#pragma once

#include "engine/tensor.h"

namespace rg {

// training: normalizes with the batch mean and biased variance, then, if running_mean/var are
// defined, updates them in place (not recorded by autograd): running = (1 - momentum) * running
// + momentum * batch, running_var taking the unbiased variance (n / (n - 1)).
// Not training: normalizes with running_mean/var, which must then be defined.
// weight (gamma) and bias (beta) are [C] or undefined (1 and 0).
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                  double eps = 1e-5);

}  // namespace rg
