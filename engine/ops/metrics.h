// Evaluation metrics on logits: argmax, top-k hit counts and accuracy. Never recorded by autograd.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace rg {

// Index (i64) of the largest value along `dim`; ties go to the lowest index and NaN counts as the
// largest value, like torch.argmax.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);

// Number of rows of logits [N, C] whose target (i64 [N]) is among the k largest values. Ties are
// ranked by index (the lower index wins), so exactly k classes are "in the top k".
int64_t topk_correct(const Tensor& logits, const Tensor& target, int64_t k = 1);

// topk_correct / N, in [0, 1]; N must be positive.
double accuracy(const Tensor& logits, const Tensor& target, int64_t k = 1);

}  // namespace rg
