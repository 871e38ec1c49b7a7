// Matrix products through GEMM (OpenBLAS on the CPU, cuBLAS on CUDA): matmul (1-D, 2-D and batched
// 3-D operands, like torch.matmul) and linear with PyTorch's weight layout.
#pragma once

#include "engine/tensor.h"

namespace rg {

// Supported shapes: [k]x[k] -> [], [k]x[k,n] -> [n], [m,k]x[k] -> [m], [m,k]x[k,n] -> [m,n],
// [b,m,k]x[b,k,n] -> [b,m,n], [b,m,k]x[k,n] -> [b,m,n] and [m,k]x[b,k,n] -> [b,m,n].
Tensor matmul(const Tensor& a, const Tensor& b);

// y = x W^T + b with x [..., in], weight [out, in], bias [out] (an undefined Tensor: no bias);
// y has x's shape with the last dimension replaced by out.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// out = op(a) op(b) with op a transpose where the flag says so: a is [m, k] ([k, m] with trans_a),
// b is [k, n] ([n, k] with trans_b), out a defined [m, n] tensor of the same dtype and device,
// overwritten. No autograd. For code that multiplies windows of flat buffers where they lie, such
// as PowerSGD's factors of a gradient bucket.
void matmul_out(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out);

// On CUDA, f32 products may use TF32 tensor cores with rg::cuda::set_allow_tf32_matmul(true)
// (engine/tf32.h); off by default, as in PyTorch.

}  // namespace rg
