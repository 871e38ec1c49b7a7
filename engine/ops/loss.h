// Classification losses with class-index targets (mean over the batch, like PyTorch's defaults):
// softmax, log_softmax, nll_loss, a fused cross_entropy with label smoothing, and the regression
// losses mse_loss and smooth_l1_loss. A target outside [0, C) is an error naming its row on every
// device (on CUDA the loss reads one value back).
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace rg {

// exp(x - max) / sum(exp(x - max)) along `dim` (negative counts from the end).
Tensor softmax(const Tensor& x, int64_t dim);

// Numerically stable log(softmax(x)) along `dim` (negative counts from the end).
Tensor log_softmax(const Tensor& x, int64_t dim);

// -mean_i log_probs[i, target[i]] with log_probs [N, C] and target i64 [N]; a 0-d result.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target);

// nll_loss(log_softmax(logits, 1), target) in one pass, with PyTorch's label smoothing:
// (1 - eps) * nll + eps * mean_i mean_j(-log_softmax(logits)[i, j]); eps must be in [0, 1].
Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0.0);

// mean((input - target)^2) over all elements, as torch.nn.functional.mse_loss; input and target
// have the same shape (no broadcasting) and both may require grad; a 0-d result.
Tensor mse_loss(const Tensor& input, const Tensor& target);

// mean over all elements of 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, with
// d = input - target, as torch.nn.functional.smooth_l1_loss (beta >= 0; beta == 0 is the L1
// loss, whose gradient at d == 0 is 0); shapes and gradients as mse_loss; a 0-d result.
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, double beta = 1.0);

}  // namespace rg
