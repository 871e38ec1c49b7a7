// 2-D convolution (groups = 1) on NCHW device arrays through cuDNN: forward, data gradient and
// weight gradient, with kernels/cpu/conv2d.h's geometry. Plain C++ header: `stream` is a
// cudaStream_t. The bias is the engine's (a per-channel add and a sum), not cuDNN's.
#pragma once

#include <cstdint>

#include "kernels/cpu/conv2d.h"

namespace rg::kernels::cuda {

using cpu::Conv2dGeometry;

enum class ConvPass { forward, backward_data, backward_weight };

// Instantiated for float, double, Half and BFloat16 (f16/bf16 accumulate in f32). allow_tf32
// lets f32 convolutions use TF32 tensor cores (PyTorch's torch.backends.cudnn.allow_tf32, on
// by default there); the half types always may use tensor cores.
//
// Each pass's algorithm is chosen once per (device, geometry, dtype, math) from cuDNN's
// heuristics (cudnnGet*Algorithm_v7): the first deterministic one whose workspace is at most
// kMaxConvWorkspaceBytes (else the first that fits), and cached. The caller allocates the
// workspace that conv2d_workspace_bytes reports and passes it in.
inline constexpr int64_t kMaxConvWorkspaceBytes = int64_t(256) << 20;

template <class T>
int64_t conv2d_workspace_bytes(const Conv2dGeometry& g, ConvPass pass, bool allow_tf32,
                               void* stream);

// y [n, o, ho, wo] = conv(x [n, c, h, w], w [o, c, kh, kw])
template <class T>
void conv2d_forward(const Conv2dGeometry& g, const T* x, const T* w, T* y, bool allow_tf32,
                    void* workspace, int64_t workspace_bytes, void* stream);
// gx [n, c, h, w] from gy [n, o, ho, wo] and w (overwritten, not accumulated into)
template <class T>
void conv2d_backward_data(const Conv2dGeometry& g, const T* w, const T* gy, T* gx, bool allow_tf32,
                          void* workspace, int64_t workspace_bytes, void* stream);
// gw [o, c, kh, kw] from x and gy (overwritten)
template <class T>
void conv2d_backward_weight(const Conv2dGeometry& g, const T* x, const T* gy, T* gw,
                            bool allow_tf32, void* workspace, int64_t workspace_bytes,
                            void* stream);

}  // namespace rg::kernels::cuda
