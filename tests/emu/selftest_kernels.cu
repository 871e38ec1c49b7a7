// Correct kernels for the CUDA emulator's self-tests (barriers, shared memory, warp collectives,
// atomics, indexing, conversions, math). Built by nvcc as well, so they are valid CUDA.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "emu/selftest_kernels.h"
#include "kernels/cuda/check.h"

namespace rg::emu_test {
namespace {

constexpr int kMaxBlock = 1024;

__global__ void barrier_visibility_kernel(long long* out) {
  __shared__ int slots[kMaxBlock];
  const unsigned int t = threadIdx.x;
  slots[t] = static_cast<int>(3 * t + blockIdx.x);
  __syncthreads();
  long long sum = 0;
  for (unsigned int j = 0; j < blockDim.x; ++j) sum += slots[j];
  out[blockIdx.x * blockDim.x + t] = sum;
}

__global__ void barrier_rounds_kernel(const int* in, int* out, int rounds) {
  __shared__ int buf[2][kMaxBlock];
  const unsigned int t = threadIdx.x;
  const unsigned int n = blockDim.x;
  int cur = 0;
  buf[0][t] = in[blockIdx.x * n + t];
  __syncthreads();
  for (int r = 0; r < rounds; ++r) {
    buf[cur ^ 1][t] = buf[cur][t] + buf[cur][(t + 1) % n];
    cur ^= 1;
    __syncthreads();
  }
  out[blockIdx.x * n + t] = buf[cur][t];
}

__global__ void sync_predicates_kernel(int* out) {
  const unsigned int t = threadIdx.x;
  const int count = __syncthreads_count(t % 3 == 0);
  const int all_true = __syncthreads_and(1);
  const int all_some = __syncthreads_and(t != 5);
  const int any_one = __syncthreads_or(t == blockDim.x - 1);
  const int any_none = __syncthreads_or(0);
  if (t == 0) {
    out[0] = count;
    out[1] = all_true;
    out[2] = all_some;
    out[3] = any_one;
    out[4] = any_none;
  }
}

__device__ int tagged(unsigned int block, int round, unsigned int index) {
  return static_cast<int>(block * 100000u + static_cast<unsigned int>(round) * 1000u + index);
}

__global__ void static_shared_private_kernel(int* mismatches, int rounds) {
  __shared__ int tile[kMaxBlock];
  const unsigned int t = threadIdx.x;
  const unsigned int n = blockDim.x;
  int bad = 0;
  for (int r = 0; r < rounds; ++r) {
    tile[t] = tagged(blockIdx.x, r, t);
    __syncthreads();
    for (unsigned int j = 0; j < n; ++j) bad += tile[j] != tagged(blockIdx.x, r, j);
    __syncthreads();
  }
  mismatches[blockIdx.x * n + t] = bad;
}

__global__ void dynamic_shared_private_kernel(int* mismatches, int per_thread) {
  RG_DYNAMIC_SHARED(int, buf);
  const unsigned int t = threadIdx.x;
  const unsigned int n = blockDim.x;
  const unsigned int k = static_cast<unsigned int>(per_thread);
  for (unsigned int i = 0; i < k; ++i) buf[t * k + i] = tagged(blockIdx.x, 0, t * k + i);
  __syncthreads();
  int bad = reinterpret_cast<uintptr_t>(buf) % 16 != 0;
  for (unsigned int i = 0; i < n * k; ++i) bad += buf[i] != tagged(blockIdx.x, 0, i);
  mismatches[blockIdx.x * n + t] = bad;
}

__global__ void shuffle_kernel(const int* in, int* out, int op, int arg, int width,
                               unsigned int mask) {
  const unsigned int t = threadIdx.x;
  const unsigned int lane = t % 32;
  const int v = in[t];
  int r = -1;
  if ((mask >> lane) & 1u) {
    switch (op) {
      case 0:
        r = __shfl_sync(mask, v, arg, width);
        break;
      case 1:
        r = __shfl_up_sync(mask, v, static_cast<unsigned int>(arg), width);
        break;
      case 2:
        r = __shfl_down_sync(mask, v, static_cast<unsigned int>(arg), width);
        break;
      default:
        r = __shfl_xor_sync(mask, v, arg, width);
        break;
    }
  }
  out[t] = r;
}

__global__ void split_mask_shuffle_kernel(const int* in, int* out) {
  const unsigned int t = threadIdx.x;
  const unsigned int mask = t % 32 < 16 ? 0x0000ffffu : 0xffff0000u;
  const int x = __shfl_xor_sync(mask, in[t], 1);
  const int d = __shfl_down_sync(mask, in[t], 4, 16);
  out[t] = x + 1000 * d;
}

template <class T>
__global__ void warp_sum_kernel(const T* in, T* out) {
  const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
  T v = in[i];
  for (unsigned int offset = 16; offset > 0; offset /= 2) {
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  if (threadIdx.x % 32 == 0) out[i / 32] = v;
}

__global__ void vote_kernel(const int* pred, unsigned int* ballot, int* any, int* all,
                            unsigned int mask) {
  const unsigned int t = threadIdx.x;
  if ((mask >> (t % 32)) & 1u) {
    ballot[t] = __ballot_sync(mask, pred[t]);
    any[t] = __any_sync(mask, pred[t]);
    all[t] = __all_sync(mask, pred[t]);
  } else {
    ballot[t] = 0xdeadbeefu;
    any[t] = -1;
    all[t] = -1;
  }
}

__global__ void syncwarp_rotate_kernel(int* out) {
  __shared__ int slots[kMaxBlock];
  const unsigned int t = threadIdx.x;
  slots[t] = static_cast<int>(t * 7);
  __syncwarp();
  out[t] = slots[t / 32 * 32 + (t + 1) % 32];
}

__global__ void atomic_counts_kernel(AtomicCounters* c, unsigned int* exch_old) {
  const unsigned int id = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(&c->i32, 1);
  atomicAdd(&c->u32, 2u);
  atomicAdd(&c->u64, 3ull);
  atomicAdd(reinterpret_cast<unsigned long long*>(&c->i64), static_cast<unsigned long long>(-2ll));
  atomicAdd(&c->f32, 1.0f);
  atomicMax(&c->max_i32, static_cast<int>(id));
  atomicMin(&c->min_i32, -static_cast<int>(id));
  atomicMax(&c->max_i64, static_cast<long long>(id) * 1000000000ll);
  unsigned long long old = c->cas_u64;
  unsigned long long assumed = 0;
  do {
    assumed = old;
    old = atomicCAS(&c->cas_u64, assumed, assumed + 1);
  } while (old != assumed);
  exch_old[id] = atomicExch(&c->exch_slot, id);
  atomicInc(&c->inc_u32, 999u);
}

__global__ void index_coverage_kernel(unsigned int* hits, unsigned int* bad) {
  if (threadIdx.x >= blockDim.x || threadIdx.y >= blockDim.y || threadIdx.z >= blockDim.z ||
      blockIdx.x >= gridDim.x || blockIdx.y >= gridDim.y || blockIdx.z >= gridDim.z) {
    atomicAdd(bad, 1u);
    return;
  }
  const unsigned long long nx = 1ull * gridDim.x * blockDim.x;
  const unsigned long long ny = 1ull * gridDim.y * blockDim.y;
  const unsigned long long x = 1ull * blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long y = 1ull * blockIdx.y * blockDim.y + threadIdx.y;
  const unsigned long long z = 1ull * blockIdx.z * blockDim.z + threadIdx.z;
  atomicAdd(&hits[(z * ny + y) * nx + x], 1u);
}

__global__ void half_round_trip_kernel(const float* in, unsigned short* half_bits, float* half_back,
                                       unsigned short* bf16_bits, float* bf16_back, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const __half h = __float2half(in[i]);
  half_bits[i] = __half_as_ushort(h);
  half_back[i] = __half2float(h);
  const __nv_bfloat16 b = __float2bfloat16(in[i]);
  bf16_bits[i] = __bfloat16_as_ushort(b);
  bf16_back[i] = __bfloat162float(b);
}

__global__ void math_functions_kernel(const float* x, float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const float v = x[i];
  const float a = fabsf(v) + 0.5f;
  float* o = out + static_cast<long long>(i) * kMathFunctions;
  o[0] = expf(v);
  o[1] = logf(a);
  o[2] = sqrtf(a);
  o[3] = rsqrtf(a);
  o[4] = tanhf(v);
  o[5] = erff(v);
  o[6] = fmaxf(v, 0.25f);
  o[7] = fminf(v, 0.25f);
  o[8] = __expf(v);
  o[9] = __fdividef(v, 3.0f);
  o[10] = powf(a, 1.5f);
  o[11] = sinf(v) + cosf(v);
  o[12] = log1pf(a);
  o[13] = static_cast<float>(exp(static_cast<double>(v)));
  o[14] = static_cast<float>(min(i, 7) + max(i, 7));
  o[15] = __logf(a);
}

__global__ void launch_config_kernel() {}

}  // namespace

void barrier_visibility(long long* out, int blocks, int threads) {
  RG_LAUNCH(barrier_visibility_kernel, blocks, threads, 0, cudaStream_t{}, out);
}

void barrier_rounds(const int* in, int* out, int blocks, int threads, int rounds) {
  RG_LAUNCH(barrier_rounds_kernel, blocks, threads, 0, cudaStream_t{}, in, out, rounds);
}

void sync_predicates(int* out, int threads) {
  RG_LAUNCH(sync_predicates_kernel, 1, threads, 0, cudaStream_t{}, out);
}

void static_shared_private(int* mismatches, int blocks, int threads, int rounds) {
  RG_LAUNCH(static_shared_private_kernel, blocks, threads, 0, cudaStream_t{}, mismatches, rounds);
}

void dynamic_shared_private(int* mismatches, int blocks, int threads, int per_thread) {
  const size_t shmem = sizeof(int) * static_cast<size_t>(threads) * per_thread;
  RG_LAUNCH(dynamic_shared_private_kernel, blocks, threads, shmem, cudaStream_t{}, mismatches,
            per_thread);
}

void shuffle(const int* in, int* out, int threads, ShuffleOp op, int arg, int width,
             unsigned int mask) {
  RG_LAUNCH(shuffle_kernel, 1, threads, 0, cudaStream_t{}, in, out, static_cast<int>(op), arg,
            width, mask);
}

void split_mask_shuffle(const int* in, int* out, int threads) {
  RG_LAUNCH(split_mask_shuffle_kernel, 1, threads, 0, cudaStream_t{}, in, out);
}

void warp_sum(const float* in, float* out, int blocks, int threads) {
  RG_LAUNCH(warp_sum_kernel<float>, blocks, threads, 0, cudaStream_t{}, in, out);
}
void warp_sum(const double* in, double* out, int blocks, int threads) {
  RG_LAUNCH(warp_sum_kernel<double>, blocks, threads, 0, cudaStream_t{}, in, out);
}
void warp_sum(const long long* in, long long* out, int blocks, int threads) {
  RG_LAUNCH(warp_sum_kernel<long long>, blocks, threads, 0, cudaStream_t{}, in, out);
}
void warp_sum(const unsigned int* in, unsigned int* out, int blocks, int threads) {
  RG_LAUNCH(warp_sum_kernel<unsigned int>, blocks, threads, 0, cudaStream_t{}, in, out);
}

void vote(const int* pred, unsigned int* ballot, int* any, int* all, int threads,
          unsigned int mask) {
  RG_LAUNCH(vote_kernel, 1, threads, 0, cudaStream_t{}, pred, ballot, any, all, mask);
}

void syncwarp_rotate(int* out, int threads) {
  RG_LAUNCH(syncwarp_rotate_kernel, 1, threads, 0, cudaStream_t{}, out);
}

void atomic_counts(AtomicCounters* c, unsigned int* exch_old, int blocks, int threads) {
  RG_LAUNCH(atomic_counts_kernel, blocks, threads, 0, cudaStream_t{}, c, exch_old);
}

void index_coverage(unsigned int* hits, unsigned int* bad, const unsigned int grid[3],
                    const unsigned int block[3]) {
  RG_LAUNCH(index_coverage_kernel, dim3(grid[0], grid[1], grid[2]),
            dim3(block[0], block[1], block[2]), 0, cudaStream_t{}, hits, bad);
}

void half_round_trip(const float* in, unsigned short* half_bits, float* half_back,
                     unsigned short* bf16_bits, float* bf16_back, int n) {
  RG_LAUNCH(half_round_trip_kernel, (n + 127) / 128, 128, 0, cudaStream_t{}, in, half_bits,
            half_back, bf16_bits, bf16_back, n);
}

void math_functions(const float* x, float* out, int n) {
  RG_LAUNCH(math_functions_kernel, (n + 63) / 64, 64, 0, cudaStream_t{}, x, out, n);
}

void launch_config(const unsigned int grid[3], const unsigned int block[3], size_t shmem) {
  RG_LAUNCH(launch_config_kernel, dim3(grid[0], grid[1], grid[2]),
            dim3(block[0], block[1], block[2]), shmem, cudaStream_t{});
}

}  // namespace rg::emu_test
