// Launchers of the CUDA emulator's self-test kernels (tests/emu/*.cu). Plain C++ so the tests need
// no CUDA header; pointers are device memory, which under emulation is host memory.
#pragma once

#include <cstddef>

namespace rg::emu_test {

// ---- correct kernels (selftest_kernels.cu) ----

// out[b * threads + t] = sum over the block's threads j of (3 * j + b), read after a barrier.
void barrier_visibility(long long* out, int blocks, int threads);
// `rounds` ping-pong rounds with a barrier each: x[t] <- x[t] + x[(t + 1) % threads].
void barrier_rounds(const int* in, int* out, int blocks, int threads, int rounds);
// out = {__syncthreads_count(t % 3 == 0), __syncthreads_and(1), __syncthreads_and(t != 5),
//        __syncthreads_or(t == last), __syncthreads_or(0)} of one block.
void sync_predicates(int* out, int threads);
// Counts, per thread, the values of its own block and round that a neighbour's shared slot did
// not hold (0 when shared memory is per block), for static and dynamic shared memory.
void static_shared_private(int* mismatches, int blocks, int threads, int rounds);
void dynamic_shared_private(int* mismatches, int blocks, int threads, int per_thread);

enum class ShuffleOp { kIdx = 0, kUp = 1, kDown = 2, kXor = 3 };
// One block; lanes in `mask` call the shuffle with (mask, in[t], arg, width), others write -1.
void shuffle(const int* in, int* out, int threads, ShuffleOp op, int arg, int width,
             unsigned int mask);
// Lanes 0-15 and 16-31 of each warp shuffle with disjoint masks at the same time:
// out = xor(1) + 1000 * down(4, width 16).
void split_mask_shuffle(const int* in, int* out, int threads);
// Warp sums by __shfl_down_sync with a full mask; out has one value per warp.
void warp_sum(const float* in, float* out, int blocks, int threads);
void warp_sum(const double* in, double* out, int blocks, int threads);
void warp_sum(const long long* in, long long* out, int blocks, int threads);
void warp_sum(const unsigned int* in, unsigned int* out, int blocks, int threads);
// One block; lanes in `mask` vote on pred[t], others write 0xdeadbeef / -1 / -1.
void vote(const int* pred, unsigned int* ballot, int* any, int* all, int threads,
          unsigned int mask);
// Each lane writes its slot, __syncwarp(), then reads its right neighbour's in the warp.
void syncwarp_rotate(int* out, int threads);

struct AtomicCounters {
  int i32;
  unsigned int u32;
  unsigned long long u64;
  long long i64;  // added to through the unsigned long long overload, as CUDA code does
  float f32;
  int max_i32;
  int min_i32;
  long long max_i64;
  unsigned long long cas_u64;  // incremented by an atomicCAS loop
  unsigned int exch_slot;
  unsigned int inc_u32;  // atomicInc wrapping at 999
};
// Every thread of every block: i32 += 1, u32 += 2, u64 += 3, i64 -= 2, f32 += 1, max/min of its
// global id, cas_u64 += 1, exch_old[id] = atomicExch(&exch_slot, id), atomicInc(&inc_u32, 999).
void atomic_counts(AtomicCounters* c, unsigned int* exch_old, int blocks, int threads);

// hits[linear global index] += 1 for every thread of the grid; bad += 1 for an index out of range.
void index_coverage(unsigned int* hits, unsigned int* bad, const unsigned int grid[3],
                    const unsigned int block[3]);

enum class SumVariant { kCorrect, kMissingFirstSync, kMissingLoopSync };
// Tree reduction in shared memory: out[b] = sum of the block's elements (threads a power of 2).
void block_sum(const float* in, float* out, int n, int threads, SumVariant variant);

// Conversions of __half and __nv_bfloat16: bits and the value converted back.
void half_round_trip(const float* in, unsigned short* half_bits, float* half_back,
                     unsigned short* bf16_bits, float* bf16_back, int n);
// out[i * kMathFunctions + k] = function k of x[i] (see selftest_kernels.cu for the list).
inline constexpr int kMathFunctions = 16;
void math_functions(const float* x, float* out, int n);

// A trivial kernel launched with this configuration (for the launch checks).
void launch_config(const unsigned int grid[3], const unsigned int block[3], size_t shmem);

// ---- faulty kernels (faulty_kernels.cu): each must be reported or give a wrong answer ----

// Threads t >= n return before a __syncthreads() the others wait at.
void early_exit_barrier(float* out, int threads, int n);
// The two halves of the block wait at two different __syncthreads() call sites.
void split_barrier(float* out, int threads);
// Lanes 0-15 of each warp shuffle with a full mask; lanes 16-31 never do.
void missing_lanes_shuffle(int* out, int threads);
// Thread t passes t % 4 barriers in a loop.
void divergent_loop_barrier(int* out, int threads);
// Lane 1 calls __shfl_sync with a mask holding only lane 0.
void mask_without_caller(int* out);
// Thread bad_thread of block bad_block calls __trap().
void trap_in(int* out, int blocks, int threads, unsigned int bad_block, unsigned int bad_thread);

// 64 threads write s[threadIdx.x + extra] of a 64-float shared array: out of bounds for extra > 0.
enum class OobKind { kStaticIndex, kStaticPointer, kDynamic };
void shared_out_of_bounds(OobKind kind, float* out, int extra);

}  // namespace rg::emu_test
