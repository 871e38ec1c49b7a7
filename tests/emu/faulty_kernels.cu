// Kernels with the bugs the CUDA emulator must catch: a reduction missing a __syncthreads(),
// divergent barriers and warp collectives, a trap, out-of-bounds shared memory. Valid CUDA (nvcc
// builds them too); each is wrong only when it runs.
#include "emu/selftest_kernels.h"
#include "kernels/cuda/check.h"

namespace rg::emu_test {
namespace {

constexpr int kMaxBlock = 1024;

// Tree reduction of one block's elements. kMissingFirstSync starts reducing before every thread
// has stored its element; kMissingLoopSync lets a level read a partial sum before it is final.
template <SumVariant kVariant>
__global__ void block_sum_kernel(const float* in, float* out, int n) {
  __shared__ float partial[kMaxBlock];
  const unsigned int t = threadIdx.x;
  const unsigned int i = blockIdx.x * blockDim.x + t;
  partial[t] = i < static_cast<unsigned int>(n) ? in[i] : 0.0f;
  if constexpr (kVariant != SumVariant::kMissingFirstSync) __syncthreads();
  for (unsigned int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) partial[t] += partial[t + stride];
    if constexpr (kVariant != SumVariant::kMissingLoopSync) __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

__global__ void early_exit_barrier_kernel(float* out, int n) {
  __shared__ float s[kMaxBlock];
  const int t = static_cast<int>(threadIdx.x);
  if (t >= n) return;
  s[t] = static_cast<float>(t);
  __syncthreads();
  out[t] = s[(t + 1) % n];
}

__global__ void split_barrier_kernel(float* out) {
  __shared__ float s[kMaxBlock];
  const unsigned int t = threadIdx.x;
  s[t] = static_cast<float>(t);
  if (t < blockDim.x / 2) {
    __syncthreads();
    out[t] = s[t + 1];
  } else {
    __syncthreads();
    out[t] = s[t - 1];
  }
}

__global__ void missing_lanes_shuffle_kernel(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x % 32 < 16) v = __shfl_down_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

__global__ void divergent_loop_barrier_kernel(int* out) {
  for (unsigned int i = 0; i < threadIdx.x % 4; ++i) __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void mask_without_caller_kernel(int* out) {
  out[threadIdx.x] = __shfl_sync(0x1u, static_cast<int>(threadIdx.x), 0);
}

__global__ void trap_kernel(int* out, unsigned int bad_block, unsigned int bad_thread) {
  if (blockIdx.x == bad_block && threadIdx.x == bad_thread) __trap();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

constexpr int kOobThreads = 64;

__global__ void static_shared_oob_index_kernel(float* out, int extra) {
  __shared__ float s[kOobThreads];
  s[threadIdx.x + extra] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}

__global__ void static_shared_oob_pointer_kernel(float* out, int extra) {
  __shared__ float s[kOobThreads];
  float* p = s + extra;  // out of sight of array bounds checks: only AddressSanitizer sees this
  p[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}

__global__ void dynamic_shared_oob_kernel(float* out, int extra) {
  RG_DYNAMIC_SHARED(float, s);
  s[threadIdx.x + extra] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}

}  // namespace

void block_sum(const float* in, float* out, int n, int threads, SumVariant variant) {
  const int blocks = (n + threads - 1) / threads;
  switch (variant) {
    case SumVariant::kCorrect:
      RG_LAUNCH(block_sum_kernel<SumVariant::kCorrect>, blocks, threads, 0, cudaStream_t{}, in, out,
                n);
      break;
    case SumVariant::kMissingFirstSync:
      RG_LAUNCH(block_sum_kernel<SumVariant::kMissingFirstSync>, blocks, threads, 0, cudaStream_t{},
                in, out, n);
      break;
    case SumVariant::kMissingLoopSync:
      RG_LAUNCH(block_sum_kernel<SumVariant::kMissingLoopSync>, blocks, threads, 0, cudaStream_t{},
                in, out, n);
      break;
  }
}

void early_exit_barrier(float* out, int threads, int n) {
  RG_LAUNCH(early_exit_barrier_kernel, 1, threads, 0, cudaStream_t{}, out, n);
}

void split_barrier(float* out, int threads) {
  RG_LAUNCH(split_barrier_kernel, 1, threads, 0, cudaStream_t{}, out);
}

void missing_lanes_shuffle(int* out, int threads) {
  RG_LAUNCH(missing_lanes_shuffle_kernel, 1, threads, 0, cudaStream_t{}, out);
}

void divergent_loop_barrier(int* out, int threads) {
  RG_LAUNCH(divergent_loop_barrier_kernel, 1, threads, 0, cudaStream_t{}, out);
}

void mask_without_caller(int* out) {
  RG_LAUNCH(mask_without_caller_kernel, 1, 32, 0, cudaStream_t{}, out);
}

void trap_in(int* out, int blocks, int threads, unsigned int bad_block, unsigned int bad_thread) {
  RG_LAUNCH(trap_kernel, blocks, threads, 0, cudaStream_t{}, out, bad_block, bad_thread);
}

void shared_out_of_bounds(OobKind kind, float* out, int extra) {
  switch (kind) {
    case OobKind::kStaticIndex:
      RG_LAUNCH(static_shared_oob_index_kernel, 1, kOobThreads, 0, cudaStream_t{}, out, extra);
      break;
    case OobKind::kStaticPointer:
      RG_LAUNCH(static_shared_oob_pointer_kernel, 1, kOobThreads, 0, cudaStream_t{}, out, extra);
      break;
    case OobKind::kDynamic:
      RG_LAUNCH(dynamic_shared_oob_kernel, 1, kOobThreads, kOobThreads * sizeof(float),
                cudaStream_t{}, out, extra);
      break;
  }
}

}  // namespace rg::emu_test
