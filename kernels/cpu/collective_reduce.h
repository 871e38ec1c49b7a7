// The reduction step of collectives (gloo's reduce function and our ring's reduce-scatter):
// out[i] = a[i] op b[i] on raw arrays, f16/bf16 computed in f32 and rounded once per step.
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

enum class CollectiveOp : uint8_t { sum, max, min };

// out may alias a or b. Single-threaded: it runs on a communication thread while the OpenMP
// pool keeps computing.
template <class T>
void collective_reduce(CollectiveOp op, T* out, const T* a, const T* b, int64_t n);

// x[i] /= divisor (the average's last step; integers truncate toward zero like NCCL's ncclAvg).
template <class T>
void divide_by(T* x, int64_t n, int64_t divisor);

}  // namespace rg::kernels::cpu
