// sum and mean over all elements or along dimensions (keepdim), and sum_to, which reduces a
// broadcast result back to an input's shape (the backward of broadcasting).
#pragma once

#include <vector>

#include "engine/tensor.h"

namespace rg {

Tensor sum(const Tensor& x);  // 0-d result
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// Sums `x` down to `shape`, which must broadcast to x's shape.
Tensor sum_to(const Tensor& x, const Shape& shape);
// Repeats `x` along broadcast dimensions up to `shape` (the backward of sum_to).
Tensor expand_to(const Tensor& x, const Shape& shape);

}  // namespace rg
