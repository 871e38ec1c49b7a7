// Self-tests of the CUDA emulator (label emu): the kernels of tests/emu/*.cu run through
// kernels/emu and must behave as CUDA specifies, and the faulty ones must be caught.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "emu/selftest_kernels.h"
#include "kernels/cuda/check.h"
#include "kernels/half.h"
#include "support/errors.h"
#include "kernels/emu/device_runtime.h"

// The kernels here get plain host memory, read right after each launch: launches wait for their
// work, as with CUDA_LAUNCH_BLOCKING=1.
static const bool kLaunchBlocking = (rg::emu::set_launch_blocking(true), true);

namespace rg::emu_test {
namespace {

using rg::testing::error_of;

// Runs f on another thread and stops the test binary if it does not finish within `limit`, so a
// regression that turns a detected deadlock into a real one fails fast instead of hanging ctest.
template <class F>
void within(std::chrono::seconds limit, F f) {
  auto promise = std::make_shared<std::promise<void>>();
  std::future<void> done = promise->get_future();
  std::thread([promise, f]() mutable {
    try {
      f();
      promise->set_value();
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  }).detach();
  if (done.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "emulated launch still running after %llds: deadlock\n",
                 static_cast<long long>(limit.count()));
    std::abort();
  }
  done.get();
}

// The message of the rg::Error that f throws, checked to come within 10 seconds.
template <class F>
std::string bounded_error(F f) {
  std::string msg;
  within(std::chrono::seconds(10), [&] { msg = error_of(f); });
  return msg;
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// ---- launch configuration and indexing ---------------------------------------------------------

TEST(EmuLaunch, CoversEveryIndexExactlyOnceIn1D2D3DGrids) {
  struct Case {
    unsigned int grid[3];
    unsigned int block[3];
  };
  const Case cases[] = {
      {{1, 1, 1}, {1, 1, 1}},    {{5, 1, 1}, {1, 1, 1}},    {{3, 1, 1}, {31, 1, 1}},
      {{7, 1, 1}, {33, 1, 1}},   {{2, 1, 1}, {1024, 1, 1}}, {{70000, 1, 1}, {1, 1, 1}},
      {{3, 2, 1}, {31, 2, 1}},   {{2, 3, 1}, {33, 3, 1}},   {{2, 2, 1}, {32, 32, 1}},
      {{3, 1, 1}, {1, 1024, 1}}, {{1, 70, 1}, {33, 1, 1}},  {{2, 3, 2}, {8, 8, 16}},
      {{3, 2, 3}, {3, 5, 2}},    {{1, 2, 2}, {1, 1, 64}},   {{2, 2, 2}, {33, 1, 1}},
      {{4, 3, 2}, {1, 31, 1}},   {{1, 1, 5}, {1024, 1, 1}},
  };
  for (const Case& c : cases) {
    size_t total = 1;
    for (int i = 0; i < 3; ++i) total *= size_t{c.grid[i]} * c.block[i];
    std::vector<unsigned int> hits(total, 0);
    unsigned int bad = 0;
    index_coverage(hits.data(), &bad, c.grid, c.block);
    SCOPED_TRACE(::testing::Message()
                 << "grid " << c.grid[0] << "x" << c.grid[1] << "x" << c.grid[2] << " block "
                 << c.block[0] << "x" << c.block[1] << "x" << c.block[2]);
    EXPECT_EQ(bad, 0u);
    size_t wrong = 0;
    for (unsigned int h : hits) wrong += h != 1;
    EXPECT_EQ(wrong, 0u);
  }
}

TEST(EmuLaunch, RejectsInvalidConfigurationsLikeTheCudaRuntime) {
  struct Case {
    unsigned int grid[3];
    unsigned int block[3];
    size_t shmem;
    const char* why;
  };
  const Case cases[] = {
      {{1, 1, 1}, {1025, 1, 1}, 0, "block (1025,1,1) has 1025 threads, more than 1024"},
      {{1, 1, 1}, {32, 32, 2}, 0, "2048 threads, more than 1024"},
      {{1, 1, 1}, {1, 1, 65}, 0, "block (1,1,65) exceeds the per-dimension limits (1024,1024,64)"},
      {{1, 1, 1}, {1, 2048, 1}, 0, "2048 threads, more than 1024"},
      {{0, 1, 1}, {32, 1, 1}, 0, "grid (0,1,1) has a zero dimension"},
      {{1, 1, 1}, {32, 0, 1}, 0, "block (32,0,1) has a zero dimension"},
      {{1, 65536, 1}, {32, 1, 1}, 0, "grid (1,65536,1) exceeds"},
      {{1, 1, 1}, {32, 1, 1}, 48 * 1024 + 1, "49153 bytes of dynamic shared memory"},
  };
  for (const Case& c : cases) {
    const std::string msg = bounded_error([&] { launch_config(c.grid, c.block, c.shmem); });
    EXPECT_CONTAINS(msg, "invalid configuration argument");
    EXPECT_CONTAINS(msg, c.why);
    EXPECT_CONTAINS(msg, "launch_config_kernel<<<");
    EXPECT_CONTAINS(msg, "tests/emu/selftest_kernels.cu:");
  }
  // The limits themselves are valid.
  const unsigned int one[3] = {1, 1, 1};
  const unsigned int full[3] = {1024, 1, 1};
  const unsigned int tall[3] = {1, 1024, 1};
  const unsigned int deep[3] = {16, 1, 64};
  EXPECT_NO_THROW(launch_config(one, full, 48 * 1024));
  EXPECT_NO_THROW(launch_config(one, tall, 0));
  EXPECT_NO_THROW(launch_config(one, deep, 0));
}

// ---- barriers and shared memory ----------------------------------------------------------------

TEST(EmuBarrier, WritesBeforeABarrierAreVisibleAfterItInEveryThread) {
  const int blocks = 3;
  for (int threads : {1, 31, 33, 64, 1024}) {
    std::vector<long long> out(size_t(blocks) * threads, -1);
    barrier_visibility(out.data(), blocks, threads);
    for (int b = 0; b < blocks; ++b) {
      const long long expected = 3ll * threads * (threads - 1) / 2 + 1ll * b * threads;
      for (int t = 0; t < threads; ++t) {
        ASSERT_EQ(out[size_t(b) * threads + t], expected) << "block " << b << " thread " << t;
      }
    }
  }
}

TEST(EmuBarrier, BarriersInALoopSeparateEveryRound) {
  std::mt19937 rng(7);
  const int blocks = 4;
  const int rounds = 6;
  for (int threads : {1, 33, 128, 1024}) {
    const size_t n = size_t(blocks) * threads;
    std::vector<int> in(n), out(n, 0), expected(n);
    for (int& v : in) v = static_cast<int>(rng() % 100);
    for (int b = 0; b < blocks; ++b) {
      std::vector<int> x(in.begin() + b * threads, in.begin() + (b + 1) * threads);
      for (int r = 0; r < rounds; ++r) {
        std::vector<int> next(threads);
        for (int t = 0; t < threads; ++t) next[t] = x[t] + x[(t + 1) % threads];
        x = next;
      }
      std::copy(x.begin(), x.end(), expected.begin() + b * threads);
    }
    barrier_rounds(in.data(), out.data(), blocks, threads, rounds);
    EXPECT_EQ(out, expected) << threads << " threads";
  }
}

TEST(EmuBarrier, SyncthreadsCountAndOr) {
  std::vector<int> out(5, -1);
  sync_predicates(out.data(), 100);
  EXPECT_EQ(out, (std::vector<int>{34, 1, 0, 1, 0}));
}

TEST(EmuSharedMemory, StaticSharedIsSharedWithinABlockAndPrivateToIt) {
  for (int threads : {32, 100, 1024}) {
    const int blocks = 16;
    std::vector<int> mismatches(size_t(blocks) * threads, -1);
    static_shared_private(mismatches.data(), blocks, threads, 3);
    EXPECT_EQ(std::accumulate(mismatches.begin(), mismatches.end(), 0), 0) << threads;
  }
}

TEST(EmuSharedMemory, DynamicSharedIsSharedWithinABlockPrivateToItAndAligned) {
  for (int threads : {1, 32, 100, 256}) {
    for (int per_thread : {1, 3, 12}) {
      const int blocks = 16;
      std::vector<int> mismatches(size_t(blocks) * threads, -1);
      dynamic_shared_private(mismatches.data(), blocks, threads, per_thread);
      EXPECT_EQ(std::accumulate(mismatches.begin(), mismatches.end(), 0), 0)
          << threads << " threads, " << per_thread << " per thread";
    }
  }
}

// ---- warp collectives --------------------------------------------------------------------------

// CUDA's shuffle semantics, written from the programming guide: the lane a shuffle reads, or
// -1 when it returns the caller's own value.
int shuffle_source(ShuffleOp op, int lane, int arg, int width) {
  const int seg = lane / width * width;
  switch (op) {
    case ShuffleOp::kIdx:
      return seg + arg % width;
    case ShuffleOp::kUp:
      return lane - seg - arg >= 0 ? lane - arg : -1;
    case ShuffleOp::kDown:
      return lane - seg + arg < width ? lane + arg : -1;
    case ShuffleOp::kXor:
      return (lane ^ arg) < seg + width ? lane ^ arg : -1;
  }
  return -1;
}

void check_shuffles(int threads, unsigned int mask, const std::vector<int>& widths) {
  std::vector<int> in(threads);
  for (int t = 0; t < threads; ++t) in[t] = 1000 + 7 * t;
  for (ShuffleOp op : {ShuffleOp::kIdx, ShuffleOp::kUp, ShuffleOp::kDown, ShuffleOp::kXor}) {
    for (int width : widths) {
      for (int arg : {0, 1, 2, 5, width - 1}) {
        std::vector<int> out(threads, 0);
        shuffle(in.data(), out.data(), threads, op, arg, width, mask);
        for (int t = 0; t < threads; ++t) {
          const int lane = t % 32;
          int expected = -1;
          if ((mask >> lane) & 1u) {
            const int src = shuffle_source(op, lane, arg, width);
            expected = src < 0 ? in[t] : in[t - lane + src];
          }
          ASSERT_EQ(out[t], expected)
              << "op " << static_cast<int>(op) << " arg " << arg << " width " << width << " mask "
              << std::hex << mask << std::dec << " thread " << t;
        }
      }
    }
  }
}

TEST(EmuWarp, ShufflesIdxUpDownXorWithAFullMask) {
  check_shuffles(64, 0xffffffffu, {32, 16, 8, 4, 2, 1});
}

TEST(EmuWarp, ShufflesWithAPartialMaskReadOnlyLanesInTheMask) {
  // Segments of width 16 keep every source inside the 16 lanes of the mask, as CUDA requires.
  check_shuffles(64, 0x0000ffffu, {16, 8});
  check_shuffles(64, 0xffff0000u, {16, 4});
  check_shuffles(64, 0x00ff00ffu, {8, 2});
}

TEST(EmuWarp, DisjointMasksInOneWarpCompleteIndependently) {
  const int threads = 64;
  std::vector<int> in(threads), out(threads, 0);
  for (int t = 0; t < threads; ++t) in[t] = t;
  split_mask_shuffle(in.data(), out.data(), threads);
  for (int t = 0; t < threads; ++t) {
    const int lane = t % 32;
    const int x = t ^ 1;
    const int d = lane % 16 + 4 < 16 ? t + 4 : t;
    EXPECT_EQ(out[t], x + 1000 * d) << t;
  }
}

template <class T>
void check_warp_sum(int threads) {
  const int blocks = 3;
  const int n = blocks * threads;
  std::vector<T> in(n);
  for (int i = 0; i < n; ++i) in[i] = static_cast<T>(i % 13 + 1);
  std::vector<T> out(n / 32, T(0));
  warp_sum(in.data(), out.data(), blocks, threads);
  for (int w = 0; w < n / 32; ++w) {
    T expected = 0;
    for (int l = 0; l < 32; ++l) expected += in[w * 32 + l];
    EXPECT_EQ(out[w], expected) << "warp " << w;
  }
}

TEST(EmuWarp, WarpReductionsOfEveryShuffledType) {
  for (int threads : {32, 96, 1024}) {
    check_warp_sum<float>(threads);
    check_warp_sum<double>(threads);
    check_warp_sum<long long>(threads);
    check_warp_sum<unsigned int>(threads);
  }
}

TEST(EmuWarp, BallotAnyAllWithFullAndPartialMasks) {
  const int threads = 64;
  for (unsigned int mask : {0xffffffffu, 0x0f0f0f0fu, 0x00000001u, 0x80000000u}) {
    for (int pattern = 0; pattern < 4; ++pattern) {
      std::vector<int> pred(threads);
      for (int t = 0; t < threads; ++t) {
        pred[t] = pattern == 0 ? 0 : pattern == 1 ? 1 : pattern == 2 ? t % 3 == 0 : t >= 40;
      }
      std::vector<unsigned int> ballot(threads);
      std::vector<int> any(threads), all(threads);
      vote(pred.data(), ballot.data(), any.data(), all.data(), threads, mask);
      for (int t = 0; t < threads; ++t) {
        const int lane = t % 32;
        if (((mask >> lane) & 1u) == 0) {
          EXPECT_EQ(ballot[t], 0xdeadbeefu);
          continue;
        }
        unsigned int expected = 0;
        for (int l = 0; l < 32; ++l) {
          if (((mask >> l) & 1u) && pred[t - lane + l]) expected |= 1u << l;
        }
        EXPECT_EQ(ballot[t], expected) << "mask " << std::hex << mask << std::dec << " t " << t;
        EXPECT_EQ(any[t], static_cast<int>(expected != 0));
        EXPECT_EQ(all[t], static_cast<int>(expected == mask));
      }
    }
  }
}

TEST(EmuWarp, SyncwarpOrdersSharedMemoryWithinAWarp) {
  const int threads = 96;
  std::vector<int> out(threads, -1);
  syncwarp_rotate(out.data(), threads);
  for (int t = 0; t < threads; ++t) EXPECT_EQ(out[t], (t / 32 * 32 + (t + 1) % 32) * 7) << t;
}

// ---- atomics -----------------------------------------------------------------------------------

TEST(EmuAtomics, ExactCountsFromManyParallelBlocks) {
  const int blocks = 256;
  const int threads = 128;
  const unsigned int n = blocks * threads;
  AtomicCounters c{};
  c.min_i32 = 0;
  c.exch_slot = 0xffffffffu;
  std::vector<unsigned int> exch_old(n, 0);
  atomic_counts(&c, exch_old.data(), blocks, threads);
  EXPECT_EQ(c.i32, static_cast<int>(n));
  EXPECT_EQ(c.u32, 2 * n);
  EXPECT_EQ(c.u64, 3ull * n);
  EXPECT_EQ(c.i64, -2ll * n);
  EXPECT_EQ(c.f32, static_cast<float>(n));  // integer-valued adds are exact below 2^24
  EXPECT_EQ(c.max_i32, static_cast<int>(n - 1));
  EXPECT_EQ(c.min_i32, -static_cast<int>(n - 1));
  EXPECT_EQ(c.max_i64, (n - 1) * 1000000000ll);
  EXPECT_EQ(c.cas_u64, n);
  EXPECT_EQ(c.inc_u32, n % 1000);
  // Every exchange returned a different earlier value: together with the final one they are
  // the initial value and every id, each exactly once.
  std::vector<unsigned int> seen(exch_old);
  seen.push_back(c.exch_slot);
  std::sort(seen.begin(), seen.end());
  std::vector<unsigned int> expected(n);
  std::iota(expected.begin(), expected.end(), 0u);
  expected.push_back(0xffffffffu);
  EXPECT_EQ(seen, expected);
}

// ---- a reduction, right and with a missing __syncthreads() -------------------------------------

std::vector<float> reduction_input(int n) {
  std::mt19937 rng(11);
  std::vector<float> in(n);
  for (float& v : in) v = static_cast<float>(rng() % 1000 + 1);  // exact sums in any order
  return in;
}

std::vector<float> expected_block_sums(const std::vector<float>& in, int threads) {
  const int n = static_cast<int>(in.size());
  std::vector<float> sums((n + threads - 1) / threads, 0.0f);
  for (int i = 0; i < n; ++i) sums[i / threads] += in[i];
  return sums;
}

TEST(EmuReduction, BlockSumWithSyncthreadsIsExact) {
  for (int threads : {1, 32, 256, 1024}) {
    for (int n : {1, 31, 33, 1000, 4097}) {
      const std::vector<float> in = reduction_input(n);
      std::vector<float> out((n + threads - 1) / threads, -1.0f);
      block_sum(in.data(), out.data(), n, threads, SumVariant::kCorrect);
      EXPECT_EQ(out, expected_block_sums(in, threads)) << threads << " threads, n " << n;
    }
  }
}

TEST(EmuReduction, AMissingSyncthreadsGivesWrongSums) {
  // Threads run in order up to their next barrier, so without the barrier a thread reads
  // partial sums the others have not written yet: the emulator makes this race visible.
  const int threads = 256;
  const int n = 16 * threads;
  const std::vector<float> in = reduction_input(n);
  const std::vector<float> expected = expected_block_sums(in, threads);
  for (SumVariant v : {SumVariant::kMissingFirstSync, SumVariant::kMissingLoopSync}) {
    std::vector<float> out(expected.size(), -1.0f);
    block_sum(in.data(), out.data(), n, threads, v);
    size_t wrong = 0;
    for (size_t b = 0; b < out.size(); ++b) wrong += out[b] != expected[b];
    EXPECT_GE(wrong, out.size() / 2) << "variant " << static_cast<int>(v);
  }
}

// ---- errors: divergent barriers, traps, exceptions ---------------------------------------------

TEST(EmuErrors, ThreadsThatExitBeforeABarrierAreReported) {
  std::vector<float> out(64);
  const std::string msg = bounded_error([&] { early_exit_barrier(out.data(), 64, 16); });
  EXPECT_CONTAINS(msg, "tests/emu/faulty_kernels.cu:");
  EXPECT_CONTAINS(msg, "early_exit_barrier_kernel<<<(1,1,1), (64,1,1), 0>>>");
  EXPECT_CONTAINS(msg, "block (0,0,0): deadlock");
  EXPECT_CONTAINS(msg, "threads 0-15 wait at __syncthreads() (tests/emu/faulty_kernels.cu:");
  EXPECT_CONTAINS(msg, "threads 16-63 exited");
}

TEST(EmuErrors, BarriersAtDifferentCallSitesAreReported) {
  std::vector<float> out(64);
  const std::string msg = bounded_error([&] { split_barrier(out.data(), 64); });
  EXPECT_CONTAINS(msg, "threads 0-31 wait at __syncthreads() (tests/emu/faulty_kernels.cu:");
  EXPECT_CONTAINS(msg, "threads 32-63 wait at __syncthreads() (tests/emu/faulty_kernels.cu:");
  // Two different lines.
  const size_t a = msg.find("faulty_kernels.cu:");
  const size_t b = msg.find("faulty_kernels.cu:", msg.find("threads 32-63"));
  ASSERT_NE(b, std::string::npos);
  EXPECT_NE(std::atoi(msg.c_str() + a + 18), std::atoi(msg.c_str() + b + 18)) << msg;
}

TEST(EmuErrors, ABarrierInALoopWithThreadDependentTripsIsReported) {
  std::vector<int> out(64);
  const std::string msg = bounded_error([&] { divergent_loop_barrier(out.data(), 64); });
  EXPECT_CONTAINS(msg, "deadlock");
  EXPECT_CONTAINS(msg, "exited");
}

TEST(EmuErrors, AWarpCollectiveWithMissingLanesIsReported) {
  std::vector<int> out(64);
  const std::string msg = bounded_error([&] { missing_lanes_shuffle(out.data(), 64); });
  EXPECT_CONTAINS(msg, "threads 0-15 wait at __shfl_down_sync(mask 0xffffffff) in warp 0");
  EXPECT_CONTAINS(msg, "threads 32-47 wait at __shfl_down_sync(mask 0xffffffff) in warp 1");
  EXPECT_CONTAINS(msg, "threads 16-31, 48-63 exited");
}

TEST(EmuErrors, TheCallingLaneMustBeInTheMask) {
  std::vector<int> out(32);
  const std::string msg = bounded_error([&] { mask_without_caller(out.data()); });
  EXPECT_CONTAINS(msg, "block (0,0,0) thread (1,0,0): __shfl_sync(mask 0x1)");
  EXPECT_CONTAINS(msg, "the calling lane 1 is not in the mask");
}

TEST(EmuErrors, TrapStopsTheLaunchAndNamesTheThread) {
  std::vector<int> out(8 * 64);
  const std::string msg = bounded_error([&] { trap_in(out.data(), 8, 64, 3, 5); });
  EXPECT_CONTAINS(msg,
                  "trap_kernel<<<(8,1,1), (64,1,1), 0>>>: block (3,0,0) thread (5,0,0): "
                  "__trap() at tests/emu/faulty_kernels.cu:");
}

TEST(EmuErrors, LaunchesWorkAfterAFailedOne) {
  std::vector<float> bad(64);
  EXPECT_FALSE(bounded_error([&] { early_exit_barrier(bad.data(), 64, 16); }).empty());
  std::vector<float> out(64, -1.0f);
  within(std::chrono::seconds(10), [&] { early_exit_barrier(out.data(), 64, 64); });
  for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], static_cast<float>((t + 1) % 64));
}

// ---- emulator-only behaviour (kernels written here, never built by nvcc) -----------------------

struct NotAnRgError {
  int code;
};

__global__ void throwing_kernel(int bad_thread) {
  if (static_cast<int>(threadIdx.x) == bad_thread) throw NotAnRgError{42};
  __syncthreads();
}

TEST(EmuErrors, OtherExceptionsPropagateUnchangedAndUnwindTheBlock) {
  within(std::chrono::seconds(10), [] {
    try {
      RG_LAUNCH(throwing_kernel, 4, 128, 0, cudaStream_t{}, 77);
      ADD_FAILURE() << "no exception";
    } catch (const NotAnRgError& e) {
      EXPECT_EQ(e.code, 42);
    }
  });
}

TEST(EmuErrors, IntrinsicsOutsideAKernelThrow) {
  EXPECT_CONTAINS(error_of([] { __syncthreads(); }), "__syncthreads() called outside an emulated");
  EXPECT_CONTAINS(error_of([] { (void)__shfl_sync(0xffffffffu, 1, 0); }), "outside an emulated");
}

__global__ void launching_kernel() { RG_LAUNCH(throwing_kernel, 1, 1, 0, cudaStream_t{}, -1); }

TEST(EmuErrors, LaunchingFromInsideAKernelIsRejected) {
  EXPECT_CONTAINS(bounded_error([] { RG_LAUNCH(launching_kernel, 1, 1, 0, cudaStream_t{}); }),
                  "launched from inside an emulated kernel");
}

int g_evaluations = 0;
int evaluate_once(int v) {
  ++g_evaluations;
  return v;
}

__global__ void own_copy_kernel(int* out, int value, double scale) {
  value += static_cast<int>(threadIdx.x);  // each thread changes only its own copy
  __syncthreads();
  out[threadIdx.x] = value + static_cast<int>(scale);
}

TEST(EmuLaunch, ArgumentsAreConvertedOnceAndEveryThreadGetsItsOwnCopy) {
  std::vector<int> out(64, -1);
  const long long wide = 100;  // converted to the kernel's int parameter, as nvcc does
  g_evaluations = 0;
  RG_LAUNCH(own_copy_kernel, 1, 64, 0, nullptr, out.data(), wide, evaluate_once(3));
  EXPECT_EQ(g_evaluations, 1);
  for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], 103 + t);
}

TEST(EmuLaunch, ConcurrentLaunchesFromSeveralHostThreads) {
  within(std::chrono::seconds(60), [] {
    std::vector<int> failures(4, 0);
    std::vector<std::thread> hosts;
    for (int h = 0; h < 4; ++h) {
      hosts.emplace_back([&failures, h] {
        const int blocks = 8;
        const int threads = 64 + 96 * h;
        for (int rep = 0; rep < 5; ++rep) {
          std::vector<long long> out(size_t(blocks) * threads, -1);
          barrier_visibility(out.data(), blocks, threads);
          for (int b = 0; b < blocks; ++b) {
            const long long expected = 3ll * threads * (threads - 1) / 2 + 1ll * b * threads;
            for (int t = 0; t < threads; ++t)
              failures[h] += out[size_t(b) * threads + t] != expected;
          }
        }
      });
    }
    for (std::thread& t : hosts) t.join();
    EXPECT_EQ(failures, std::vector<int>(4, 0));
  });
}

std::mutex g_ids_mutex;
std::set<std::thread::id> g_ids;

__global__ void record_os_thread_kernel() {
  if (threadIdx.x == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard lock(g_ids_mutex);
    g_ids.insert(std::this_thread::get_id());
  }
}

TEST(EmuLaunch, BlocksRunInParallelOnAPoolOfThreads) {
  if (rg::emu::worker_count() < 2) GTEST_SKIP() << "one worker thread (checked build or 1 core)";
  g_ids.clear();
  RG_LAUNCH(record_os_thread_kernel, 64, 32, 0, nullptr);
  EXPECT_GE(g_ids.size(), 2u);
  EXPECT_LE(g_ids.size(), static_cast<size_t>(rg::emu::worker_count()));
  EXPECT_EQ(g_ids.count(std::this_thread::get_id()), 0u);
}

__global__ void deep_stack_kernel(int* out) {
  volatile char frame[96 * 1024];  // more than the default 64 KiB fiber stack
  frame[threadIdx.x] = static_cast<char>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = frame[threadIdx.x];
}

TEST(EmuLaunch, FiberStackSizeIsConfigurable) {
  const size_t before = rg::emu::fiber_stack_bytes();
  rg::emu::set_fiber_stack_bytes(before + 256 * 1024);
  std::vector<int> out(64, -1);
  RG_LAUNCH(deep_stack_kernel, 2, 64, 0, nullptr, out.data());
  rg::emu::set_fiber_stack_bytes(before);
  for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], t);
  EXPECT_CONTAINS(error_of([] { rg::emu::set_fiber_stack_bytes(100); }), "too small");
}

// ---- conversions and math ----------------------------------------------------------------------

TEST(EmuMath, HalfAndBfloat16ConversionsRoundToNearestEven) {
  std::vector<float> in = {0.0f,
                           -0.0f,
                           1.0f,
                           -2.5f,
                           65504.0f,
                           65520.0f,
                           1e-8f,
                           6e-8f,
                           1.0f + 1.0f / 2048,
                           1.0f + 3.0f / 2048,
                           1.0f + 1.0f / 256,
                           1.0f + 3.0f / 256,
                           3.14159265f,
                           INFINITY,
                           -INFINITY};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  for (int i = 0; i < 1000; ++i) in.push_back(dist(rng));
  const int n = static_cast<int>(in.size());
  std::vector<unsigned short> half_bits(n), bf16_bits(n);
  std::vector<float> half_back(n), bf16_back(n);
  half_round_trip(in.data(), half_bits.data(), half_back.data(), bf16_bits.data(), bf16_back.data(),
                  n);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(half_bits[i], rg::float_to_half(in[i]).bits) << in[i];
    EXPECT_EQ(bf16_bits[i], rg::float_to_bfloat16(in[i]).bits) << in[i];
    EXPECT_EQ(half_back[i], rg::half_to_float(rg::Half{half_bits[i]}));
    EXPECT_EQ(bf16_back[i], rg::bfloat16_to_float(rg::BFloat16{bf16_bits[i]}));
  }
  EXPECT_EQ(half_bits[2], 0x3c00);
  EXPECT_EQ(half_bits[5], 0x7c00);   // 65520 rounds up to infinity
  EXPECT_EQ(half_bits[8], 0x3c00);   // a tie rounds to even
  EXPECT_EQ(half_bits[9], 0x3c02);   // a tie rounds to even (up)
  EXPECT_EQ(bf16_bits[10], 0x3f80);  // a tie rounds to even
  EXPECT_EQ(bf16_bits[11], 0x3f82);
}

TEST(EmuMath, DeviceFunctionsMatchTheCLibrary) {
  std::vector<float> x;
  for (int i = -40; i <= 40; ++i) x.push_back(static_cast<float>(i) * 0.137f);
  const int n = static_cast<int>(x.size());
  std::vector<float> out(size_t(n) * kMathFunctions);
  math_functions(x.data(), out.data(), n);
  for (int i = 0; i < n; ++i) {
    const float v = x[i];
    const float a = std::fabs(v) + 0.5f;
    const float expected[kMathFunctions] = {std::exp(v),
                                            std::log(a),
                                            std::sqrt(a),
                                            1.0f / std::sqrt(a),
                                            std::tanh(v),
                                            std::erf(v),
                                            std::fmax(v, 0.25f),
                                            std::fmin(v, 0.25f),
                                            std::exp(v),
                                            v / 3.0f,
                                            std::pow(a, 1.5f),
                                            std::sin(v) + std::cos(v),
                                            std::log1p(a),
                                            static_cast<float>(std::exp(double(v))),
                                            static_cast<float>(std::min(i, 7) + std::max(i, 7)),
                                            std::log(a)};
    for (int k = 0; k < kMathFunctions; ++k) {
      EXPECT_NEAR(out[size_t(i) * kMathFunctions + k], expected[k],
                  1e-6f * (1 + std::fabs(expected[k])))
          << "function " << k << " of " << v;
    }
  }
}

}  // namespace
}  // namespace rg::emu_test
