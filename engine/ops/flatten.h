// flatten: merges dimensions start_dim..end_dim into one, as a view (like torch.flatten).
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace rg {

// Negative dims count from the end. The default (1, -1) is nn.Flatten's: [N, C, H, W] -> [N, CHW].
// A 0-d tensor becomes [1], as in PyTorch.
Tensor flatten(const Tensor& x, int64_t start_dim = 1, int64_t end_dim = -1);

}  // namespace rg
