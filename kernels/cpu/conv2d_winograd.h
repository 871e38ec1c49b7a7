// Our f32 Winograd convolution, F(4x4, 3x3), for kernels/cpu/conv2d.cpp: the 3x3 stride-1 layers
// (ResNet's) on machines where oneDNN has no Winograd of its own (oneDNN 2.x has it on AVX-512
// only; below that PyTorch and oneDNN run direct convolutions).
//
// Each 4x4 output tile needs a 6x6 input tile; in the transformed domain the 9 x 16 multiplies
// per tile and channel pair become 36, and those are 36 independent GEMMs over channels
// (M[p] = U[p] V[p], p = 0..35) that OpenBLAS runs at full speed. The input gradient is the same
// algorithm on gy with the filters turned by 180 degrees and transposed. The weight gradient is
// F(3x3, 4x4): the 3x3 correlation of each 4x4 gradient tile with its 6x6 input tile, whose
// transformed products summed over all tiles are again 36 GEMMs (S[p] = GY[p] X[p]^T).
// Tiles are processed in blocks whose transformed data fits kBlockBytes; within a block the
// transforms run in parallel over channels and the GEMMs over p, so every sum is added in the same
// order whatever the thread count. The transforms run on eight tiles at once, in AVX2 + FMA where
// the CPU has them (conv2d_winograd_kernels.h). Channels-last convolutions (Conv2dGeometry::
// channels_last: x, y and their gradients [n][h][w][c], w [o][3][3][c]) run the same algorithm
// with transforms that read and write NHWC directly, eight channels per vector, and GEMMs over
// transformed data laid out one row per tile.
#pragma once

#include "kernels/conv2d.h"

namespace rg::kernels::cpu {

// Whether convolutions may use Winograd (ours, or oneDNN's convolution_auto, which picks
// F(4x4, 3x3) for most 3x3 stride-1 layers on AVX-512 machines). Its rounding error is a few
// times the direct algorithm's (see tests/engine/conv2d_winograd_test.cpp). On by default;
// RG_CONV_ALGO=direct in the environment or set_winograd_enabled(false) give PyTorch's direct
// convolutions.
bool winograd_enabled();
void set_winograd_enabled(bool enabled);

// The geometries our Winograd convolution computes: 3x3, stride 1, dilation 1, padding at most 2,
// at least 16 channels in and out (fewer make the transforms cost more than they save), non-empty.
bool winograd_applies(const Conv2dGeometry& g);

// The transform code in use: the AVX2 + FMA build when the CPU has both, else the generic one.
// Tests force either.
enum class WinogradIsa { automatic, generic, avx2 };
void set_winograd_isa(WinogradIsa isa);
bool winograd_avx2_available();

// y = conv(x, w) + bias (bias may be null).
void winograd_conv2d_forward(const Conv2dGeometry& g, const float* x, const float* w,
                             const float* bias, float* y);
// gx from gy and w.
void winograd_conv2d_input_grad(const Conv2dGeometry& g, const float* w, const float* gy,
                                float* gx);
// gw from x and gy.
void winograd_conv2d_weight_grad(const Conv2dGeometry& g, const float* x, const float* gy,
                                 float* gw);

}  // namespace rg::kernels::cpu
