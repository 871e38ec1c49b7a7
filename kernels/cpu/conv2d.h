// The CPU convolution's GEMM shapes, exposed so that benchmarks can time the same GEMMs; the
// convolution itself is kernels/conv2d.h's Conv2d<Cpu>.
#pragma once

#include <cstdint>

#include "kernels/conv2d.h"

namespace rg::kernels::cpu {

using kernels::Conv2dGeometry;

// The GEMM one chunk runs, C [m, n] = A [m, k] x B [k, n] (exposed so that benchmarks can time
// the same shapes). Forward: m = o, k = c*kh*kw, or k = c*kw for each of the kh kernel rows when
// a stride-1 convolution skips im2col. Weight gradient: m = o, n = c*kh*kw, B transposed, or
// m = c*kw, n = kh*o (one GEMM, B transposed) when im2col is skipped.
struct GemmShape {
  int64_t m, n, k;
};
GemmShape conv2d_forward_gemm(const Conv2dGeometry& g, int64_t element_size);
GemmShape conv2d_weight_grad_gemm(const Conv2dGeometry& g, int64_t element_size);

}  // namespace rg::kernels::cpu
