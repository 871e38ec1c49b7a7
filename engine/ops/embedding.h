// embedding: rows of a [V, D] table picked by i64 indices of any shape, as
// torch.nn.functional.embedding (without max_norm, scale_grad_by_freq or sparse).
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace rg {

// out[..., :] = weight[indices[...], :], of shape indices.shape() + [D]. Differentiable w.r.t.
// weight: its gradient adds the output gradient rows of equal indices (deterministically, on both
// devices); the row at padding_idx gets none (PyTorch's padding_idx; here -1 means none, any other
// value must be in [0, V)). An index outside [0, V) is an rg::Error naming it, its position and V
// (on CUDA this reads one value back from the device).
Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx = -1);

}  // namespace rg
