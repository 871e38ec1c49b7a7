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

// The GEMM one chunk runs, C [m, n] = A [m, k] x B [k, n] (exposed so that benchmarks can time
// the same shapes). Forward: m = o, k = c*kh*kw, or k = c*kw for each of the kh kernel rows when
// a stride-1 convolution skips im2col. Weight gradient: m = o, n = c*kh*kw, B transposed, or
// m = c*kw, n = kh*o (one GEMM, B transposed) when im2col is skipped.
struct GemmShape {
  int64_t m, n, k;
};
GemmShape conv2d_forward_gemm(const Conv2dGeometry& g, int64_t element_size);
GemmShape conv2d_weight_grad_gemm(const Conv2dGeometry& g, int64_t element_size);

// y = conv(x, w) + bias; bias may be null.
template <class T>
void conv2d_forward(const Conv2dGeometry& g, const T* x, const T* w, const T* bias, T* y);

// From gy [n, o, ho, wo]: gx [n, c, h, w], gw [o, c, kh, kw] and gb [o]. A null output is not
// computed; the others are overwritten (not accumulated into).
template <class T>
void conv2d_backward(const Conv2dGeometry& g, const T* x, const T* w, const T* gy, T* gx, T* gw,
                     T* gb);

}  // namespace rg::kernels::cpu
