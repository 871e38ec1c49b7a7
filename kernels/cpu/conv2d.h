// 2-D convolution (groups = 1) on raw NCHW arrays: im2col + GEMM forward, GEMM + col2im backward.
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

// Input [n, c, h, w], weight [o, c, kh, kw], output [n, o, ho, wo]; the caller computes ho/wo.
struct Conv2dGeometry {
  int64_t n, c, h, w;
  int64_t o, kh, kw;
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t ho, wo;
};

// Columns of the forward GEMM of one chunk, [o, c*kh*kw] x [c*kh*kw, columns] (exposed so that
// benchmarks can time the GEMM shapes the convolution runs).
int64_t conv2d_gemm_columns(const Conv2dGeometry& g, int64_t element_size);

// y = conv(x, w) + bias; bias may be null.
template <class T>
void conv2d_forward(const Conv2dGeometry& g, const T* x, const T* w, const T* bias, T* y);

// From gy [n, o, ho, wo]: gx [n, c, h, w], gw [o, c, kh, kw] and gb [o]. A null output is not
// computed; the others are overwritten (not accumulated into).
template <class T>
void conv2d_backward(const Conv2dGeometry& g, const T* x, const T* w, const T* gy, T* gx, T* gw,
                     T* gb);

}  // namespace rg::kernels::cpu
