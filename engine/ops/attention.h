// Causal scaled dot-product self-attention, with PyTorch's semantics
// (F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, dropout_p=dropout_p)).
#pragma once

#include "engine/generator.h"
#include "engine/tensor.h"

namespace rg {

// q, k, v: [B, H, T, Dh], one shape and dtype. out[b, h, i] = sum_{j <= i} P_ij v[b, h, j] with
// P = softmax_j(q[b, h, i] . k[b, h, j] * scale) over the keys j <= i (a causal mask). scale <= 0
// means 1 / sqrt(Dh). Differentiable in q, k and v; the forward keeps only the per-row
// log-sum-exp, and the backward recomputes P from it (FlashAttention's scheme). Under autocast it
// runs in the guard's f16/bf16, as PyTorch's (its lower-precision list); f16/bf16 on the CPU
// compute in f32.
//
// dropout_p > 0 drops each probability P_ij with probability dropout_p and scales the kept ones by
// 1 / (1 - dropout_p), inside the kernels (out = (P M) v; the mask is regenerated in the backward,
// never stored): the mask's bits come from `gen` (null: default_generator()), which this call
// advances by kernels::attention_dropout_groups(B * H, T) counters (kernels/attention.h's
// layout), so consecutive calls draw fresh masks and a generator restored from a checkpoint draws
// the same ones. There is no training flag: pass 0 in eval mode. dropout_p outside [0, 1) is an
// error.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale = 0,
                        double dropout_p = 0, Generator* gen = nullptr);

}  // namespace rg
