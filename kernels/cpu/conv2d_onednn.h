// f32 convolution through oneDNN (Debian's libdnnl, the library PyTorch's CPU convolutions call),
// for kernels/cpu/conv2d.cpp: the primitives read and write our NCHW/OIHW arrays, oneDNN reorders
// into its blocked layouts inside; with g.channels_last they read and write NHWC/OHWI arrays,
// reordered alike (faster here than oneDNN's NHWC kernels on the arrays as they are). Each
// function returns false when it did not run (oneDNN switched off, or a geometry it is not used
// for) and the caller takes the im2col + GEMM path.
#pragma once

#include <string>

#include "kernels/conv2d.h"

namespace rg::kernels::cpu {

// On by default; RG_ONEDNN=0 in the environment or set_onednn_enabled(false) switch it off (like
// torch.backends.mkldnn.enabled).
bool onednn_enabled();
void set_onednn_enabled(bool enabled);
// oneDNN uses Winograd (its convolution_auto: F(4x4, 3x3) for most 3x3 stride-1 layers on
// AVX-512 machines; about 1.4x faster ResNet-18 training there) when winograd_enabled()
// (kernels/cpu/conv2d_winograd.h). Its rounding error is about 2e-6 of the output's scale in y and
// gx against the direct algorithm's 4e-7 (and 7e-7 against 7e-6 in gw; test
// Conv2dOneDnn.WinogradAndDirectStayWithinFloatRounding).

// The name of the implementation oneDNN picked for the forward pass of `g` (e.g.
// "jit:avx512_core" or "jit_wino_4x3:avx512_core"), for tests and diagnostics.
std::string onednn_forward_impl(const Conv2dGeometry& g);
// Whether oneDNN is on and runs `g` with its Winograd algorithm.
bool onednn_runs_winograd(const Conv2dGeometry& g);

// y = conv(x, w) + bias (bias may be null).
bool onednn_conv2d_forward(const Conv2dGeometry& g, const float* x, const float* w,
                           const float* bias, float* y);
// gx (may be null) and gw (may be null) from gy; the bias gradient is the caller's.
bool onednn_conv2d_backward(const Conv2dGeometry& g, const float* x, const float* w,
                            const float* gy, float* gx, float* gw);

}  // namespace rg::kernels::cpu
