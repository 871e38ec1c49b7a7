// 2-D convolution over NCHW tensors (groups = 1) with PyTorch's output-size formula.
#pragma once

#include <array>
#include <cstdint>

#include "engine/tensor.h"

namespace rg {

// x [N, C, H, W], weight [O, C, kh, kw], bias [O] or an undefined Tensor. Returns [N, O, Ho, Wo]
// with Ho = floor((H + 2*ph - dh*(kh - 1) - 1) / sh) + 1, and Wo likewise.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              std::array<int64_t, 2> stride = {1, 1}, std::array<int64_t, 2> padding = {0, 0},
              std::array<int64_t, 2> dilation = {1, 1});

// On CUDA, f32 convolutions may use TF32 tensor cores: rg::cuda::set_allow_tf32_conv
// (engine/tf32.h), on by default as in PyTorch.

}  // namespace rg
