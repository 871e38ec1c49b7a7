// Warp and block reductions shared by the reduction-style kernels of kernels/cuda (included by .cu
// files only): warp shuffles, then one value per warp through 32 values of shared memory. The
// reduction tree depends only on blockDim.x, so results are deterministic.
#pragma once

#include <cuda_runtime.h>

namespace rg::kernels::cuda::detail {

inline constexpr unsigned int kFullMask = 0xffffffffu;

struct SumOp {
  template <class A>
  __device__ A operator()(A a, A b) const {
    return a + b;
  }
};

// NaN wins, so a NaN in a row poisons the row as on the CPU.
struct MaxOp {
  template <class A>
  __device__ A operator()(A a, A b) const {
    return (a > b || a != a) ? a : b;
  }
};

struct MinOp {
  template <class A>
  __device__ A operator()(A a, A b) const {
    return b < a ? b : a;
  }
};

template <class A, class Op>
__device__ __forceinline__ A warp_reduce(A v, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  return warp_reduce(v, SumOp{});
}

// op over a 1-D block, returned to every thread. blockDim.x is a multiple of 32 and every thread
// calls it; `scratch` is 32 values of shared memory.
template <class A, class Op>
__device__ A block_reduce(A v, Op op, A identity, A* scratch) {
  const unsigned int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_reduce(v, op);
  __syncthreads();  // a previous call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_reduce(lane < blockDim.x / 32 ? scratch[lane] : identity, op);
}

template <class A>
__device__ A block_sum(A v, A* scratch) {
  return block_reduce(v, SumOp{}, A(0), scratch);
}

}  // namespace rg::kernels::cuda::detail
