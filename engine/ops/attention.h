// Causal scaled dot-product self-attention, with PyTorch's semantics
// (F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)).
#pragma once

#include "engine/tensor.h"

namespace rg {

// q, k, v: [B, H, T, Dh], one shape and dtype. out[b, h, i] = sum_{j <= i} P_ij v[b, h, j] with
// P = softmax_j(q[b, h, i] . k[b, h, j] * scale) over the keys j <= i (a causal mask). scale <= 0
// means 1 / sqrt(Dh). Differentiable in q, k and v; the forward keeps only the per-row
// log-sum-exp, and the backward recomputes P from it (FlashAttention's scheme). Under autocast it
// runs in the guard's f16/bf16, as PyTorch's (its lower-precision list); f16/bf16 on the CPU
// compute in f32.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale = 0);

}  // namespace rg
