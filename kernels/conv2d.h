// 2-D convolution (groups = 1) on NCHW arrays (or channels last, Conv2dGeometry), one contract for
// both backends (kernels/backend.h): forward with the bias, and the backward's input, weight and
// bias gradients. kernels/cpu/conv2d.cpp defines Conv2d<Cpu> (f32, f64: im2col or shifted rows +
// OpenBLAS GEMM, col2im), and kernels/cuda/conv2d.cu Conv2d<Cuda> (f32, f64, f16, bf16: cuDNN's
// convolution, whose algorithm per pass is chosen once per configuration
// (kernels/conv_algo_cache.h) from cuDNN's heuristics, the first deterministic one within
// kMaxConvWorkspaceBytes, or by timing under kernels/algorithm_policy.h's benchmark flag,
// deterministic ones only under its deterministic flag; plus our bias kernels).
//
// Shared rules: the bias is added to the convolution's output inside forward, and its gradient,
// gy summed over the batch and the pixels, is accumulated in f64 inside backward; outputs are
// overwritten, never accumulated into; a null gradient output is not computed; an empty batch or
// image gives zero gradients. allow_tf32 lets f32 convolutions use TF32 tensor cores on CUDA
// (PyTorch's torch.backends.cudnn.allow_tf32); the CPU ignores it. The CPU convolution's threads
// are kernels::cpu::num_threads() (its GEMMs are OpenBLAS's): ctx.threads is not applied yet.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace rg::kernels {

// Input [n, c, h, w], weight [o, c, kh, kw], output [n, o, ho, wo]; the caller computes ho/wo.
// With channels_last every array (x, w, y and their gradients) lies in memory channels last,
// as PyTorch's torch.channels_last: x [n, h, w, c], w [o, kh, kw, c], y [n, ho, wo, o] (the
// dimensions keep their NCHW meaning). The CPU runs oneDNN's NHWC convolutions on them in f32
// (other dtypes: converted at its boundary); CUDA runs cuDNN on NHWC tensors.
struct Conv2dGeometry {
  int64_t n, c, h, w;
  int64_t o, kh, kw;
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t ho, wo;
  bool channels_last = false;
};

// The largest workspace a CUDA convolution algorithm may use.
inline constexpr int64_t kMaxConvWorkspaceBytes = int64_t(256) << 20;

enum class ConvPass { forward, backward };

template <class B>
struct Conv2d {
  // Scratch bytes `pass` needs (for backward: the larger of the input- and weight-gradient
  // passes; 0 on the CPU).
  template <class T>
  static int64_t workspace_bytes(const Conv2dGeometry& g, ConvPass pass, bool allow_tf32, Ctx ctx);
  // y = conv(x, w) + bias; bias may be null.
  template <class T>
  static void forward(const Conv2dGeometry& g, const T* x, const T* w, const T* bias, T* y,
                      bool allow_tf32, Workspace workspace, Ctx ctx);
  // From gy [n, o, ho, wo]: gx [n, c, h, w] (needs w), gw [o, c, kh, kw] (needs x) and gb [o].
  template <class T>
  static void backward(const Conv2dGeometry& g, const T* x, const T* w, const T* gy, T* gx, T* gw,
                       T* gb, bool allow_tf32, Workspace workspace, Ctx ctx);
};

}  // namespace rg::kernels
