// 2-D pooling over NCHW tensors with PyTorch's semantics (floor mode): max, average, and
// adaptive average pooling to 1x1.
#pragma once

#include <array>
#include <cstdint>

#include "engine/tensor.h"

namespace rg {

// Output size floor((H + 2*ph - kh) / sh) + 1 (likewise W). A stride of {0, 0} means
// stride = kernel; padding may be at most half the kernel. max_pool2d pads with -inf and routes
// each output's gradient to the first maximum of its window.
Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel,
                  std::array<int64_t, 2> stride = {0, 0}, std::array<int64_t, 2> padding = {0, 0});
// count_include_pad (PyTorch's default): padded zeros count in the divisor.
Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel,
                  std::array<int64_t, 2> stride = {0, 0}, std::array<int64_t, 2> padding = {0, 0},
                  bool count_include_pad = true);
// Only output_size {1, 1} (global average pooling) is implemented.
Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size);

}  // namespace rg
