// Softmax-family kernels on raw arrays: log_softmax over one dimension (input viewed as
// (outer, c, inner)), and the class-index losses nll_loss and fused cross entropy on [n, c] rows.
// Targets must already be validated (0 <= target[i] < c); sums over rows return double.
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

// out = x - logsumexp over c, computed as x - max - log(sum exp(x - max)).
template <class T>
void log_softmax(const T* x, T* out, int64_t outer, int64_t c, int64_t inner);
// grad_in = grad - exp(out) * sum over c of grad, from the forward's output.
template <class T>
void log_softmax_backward(const T* grad, const T* out, T* grad_in, int64_t outer, int64_t c,
                          int64_t inner);

// sum_i -log_probs[i, target[i]]
template <class T>
double nll_loss(const T* log_probs, const int64_t* target, int64_t n, int64_t c);
// grad_in[i, j] = (j == target[i]) ? value : 0
template <class T>
void nll_loss_backward(const int64_t* target, T* grad_in, int64_t n, int64_t c, T value);

// sum_i of (1 - eps) * (lse_i - x[i, target[i]]) + eps * (lse_i - mean_j x[i, j]), with
// lse_i = logsumexp_j x[i, j] written to lse[i] for the backward (eps = label_smoothing).
template <class T>
double cross_entropy(const T* logits, const int64_t* target, T* lse, int64_t n, int64_t c,
                     double label_smoothing);
// grad_in[i, j] = scale * (softmax(x)[i, j] - (1 - eps) * (j == target[i]) - eps / c)
template <class T>
void cross_entropy_backward(const T* logits, const int64_t* target, const T* lse, T* grad_in,
                            int64_t n, int64_t c, double label_smoothing, T scale);

}  // namespace rg::kernels::cpu
