// CUDA sum and mean reductions on device arrays, viewed as (outer, r, inner) like
// kernels/cpu/reduce.h: out[o, i] = sum_k in[o, k, i]. Plain C++ header: `stream` is a
// cudaStream_t. Deterministic: a fixed reduction tree per shape and no floating-point atomics, so
// two runs give bit-identical results.
#pragma once

#include <cstdint>

namespace rg::kernels::cuda {

// Instantiated for float, double, Half and BFloat16; the half types accumulate in f32.
// Reducing several dimensions is a sequence of sum_dim calls, or one when they are adjacent
// (r = the product of their sizes); keepdim changes only the caller's shape, not the layout.

// out[o, i] = sum_k in[o, k, i]   (0 when r == 0)
template <class T>
void sum_dim(const T* in, T* out, int64_t outer, int64_t r, int64_t inner, void* stream);
// out[o, i] = sum_k in[o, k, i] / r   (NaN when r == 0)
template <class T>
void mean_dim(const T* in, T* out, int64_t outer, int64_t r, int64_t inner, void* stream);

// Device scratch bytes that sum_all / mean_all need for n elements (the first pass's per-block
// partial sums); 0 when one block does it all, and workspace may then be null.
int64_t sum_all_workspace_bytes(int64_t n);
// out[0] = sum of the n elements (0 when n == 0), in two passes: per-block partials, then one
// block.
template <class T>
void sum_all(const T* in, int64_t n, T* out, void* workspace, void* stream);
// out[0] = sum / n   (NaN when n == 0)
template <class T>
void mean_all(const T* in, int64_t n, T* out, void* workspace, void* stream);

}  // namespace rg::kernels::cuda
