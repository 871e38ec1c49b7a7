// Sum reductions on raw arrays viewed as (outer, r, inner): out[o, i] = sum_k in[o, k, i].
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

template <class T>
void sum_dim(const T* in, T* out, int64_t outer, int64_t r, int64_t inner);
// Sum of all n elements (accumulated in double).
template <class T>
double sum_all(const T* in, int64_t n);

}  // namespace rg::kernels::cpu
