// f32 convolution through oneDNN (Debian's libdnnl, the library PyTorch's CPU convolutions call),
// for kernels/cpu/conv2d.cpp: the primitives read and write our NCHW/OIHW arrays, oneDNN reorders
// into its blocked layouts inside. Each function returns false when it did not run (oneDNN
// switched off, or a geometry it is not used for) and the caller takes the im2col + GEMM path.
#pragma once

#include "kernels/conv2d.h"

namespace rg::kernels::cpu {

// On by default; RG_ONEDNN=0 in the environment or set_onednn_enabled(false) switch it off (like
// torch.backends.mkldnn.enabled).
bool onednn_enabled();
void set_onednn_enabled(bool enabled);

// y = conv(x, w) + bias (bias may be null).
bool onednn_conv2d_forward(const Conv2dGeometry& g, const float* x, const float* w,
                           const float* bias, float* y);
// gx (may be null) and gw (may be null) from gy; the bias gradient is the caller's.
bool onednn_conv2d_backward(const Conv2dGeometry& g, const float* x, const float* w,
                            const float* gy, float* gx, float* gw);

}  // namespace rg::kernels::cpu
