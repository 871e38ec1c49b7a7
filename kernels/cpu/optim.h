// Fused optimizer updates on raw arrays, with PyTorch's exact update formulas.
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

struct SgdParams {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
};
// p -= lr * d, where d = g + wd*p, then momentum: buf = first ? d : momentum*buf + (1-dampening)*d,
// d = nesterov ? d + momentum*buf : buf. `buf` may be null when momentum == 0.
template <class T>
void sgd_step(T* p, const T* g, T* buf, int64_t n, const SgdParams& params, bool first_step);

struct AdamParams {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled_weight_decay;  // AdamW
};
// One Adam/AdamW step number `step` (1-based) with bias correction.
template <class T>
void adam_step(T* p, const T* g, T* m, T* v, int64_t n, const AdamParams& params, int64_t step);

}  // namespace rg::kernels::cpu
