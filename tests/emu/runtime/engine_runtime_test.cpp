// The engine's CUDA runtime (engine/cuda) over the cudart backend on emulated devices: devices,
// streams, events, copies between devices, the caching and pinned allocators (stats, caches,
// deferred reuse, out of memory), a runtime's teardown, and a process without devices.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/hash_store.h"
#include "comm/process_group_nccl.h"
#include "emu/runtime/runtime_test_util.h"
#include "engine/cuda/device_guard.h"
#include "engine/cuda/event.h"
#include "engine/cuda/graph.h"
#include "engine/cuda/memory.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/stream.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/tensor.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/emu/runtime_api.h"
#include "kernels/error.h"
#include "support/errors.h"

namespace rg {
namespace {

using ::rg::emu_runtime_test::AsyncRuntimeTest;
using ::rg::emu_runtime_test::StreamGate;
using ::rg::testing::error_of;
using ::rg::testing::expect_error;
using namespace std::chrono_literals;

constexpr int64_t kN = 1000;  // 4000 bytes of f32: one 4 KiB block of the small pool
constexpr size_t kMiB = size_t(1) << 20;

int emulated_device() {
  int d = -1;
  EXPECT_EQ(cudaGetDevice(&d), cudaSuccess);
  return d;
}

Tensor filled(int64_t n, double value, int device) {
  Tensor t = Tensor::empty({n}, DType::f32, Device::cuda(device));
  t.fill_(value);
  return t;
}

bool all_equal(const Tensor& t, float value) {
  for (float x : t.to(Device::cpu()).to_vector<float>()) {
    if (x != value) return false;
  }
  return true;
}

// Waits for every device, so that the caches hold no block that queued work still uses.
void synchronize_all() {
  for (int d = 0; d < cuda::runtime().device_count(); ++d) cuda::synchronize(d);
}

class EngineCudaRuntime : public AsyncRuntimeTest {
 protected:
  static constexpr int kDevices = 3;
  void SetUp() override {
    ASSERT_GE(cuda::runtime().device_count(), kDevices)
        << "run with RG_EMU_DEVICES=" << kDevices << " (ctest sets it)";
    synchronize_all();
  }
  void TearDown() override { synchronize_all(); }
};

// ---- Devices ----

TEST_F(EngineCudaRuntime, BackendCallsRunOnTheirDeviceAndKeepTheCallersDevice) {
  cuda::DeviceGuard on0(0);
  const std::vector<float> values(size_t(kN), 2.5f);
  Tensor t = from_vector(values, {kN}).to(Device::cuda(1));
  EXPECT_EQ(emu::memory_owner(t.raw_data()), 1) << "allocated on the caller's device, not cuda:1";
  EXPECT_EQ(emulated_device(), 0) << "a call for cuda:1 left cuda:1 current";
  EXPECT_EQ(t.to(Device::cpu()).to_vector<float>(), values);
  t.zero_();  // a memset, queued on cuda:1 by the backend
  EXPECT_TRUE(all_equal(t, 0.0f));
  EXPECT_EQ(emulated_device(), 0);
  EXPECT_EQ(cuda::current_device(), 0);
  EXPECT_EQ(cuda::runtime().backend().unavailable_reason(), "") << "devices are visible";
}

// fill_ and same-device casts launch kernels: on the tensor's device (whose legacy stream the
// null stream then is), not on the caller's current device, where they would race with the
// tensor's own stream (the race detector reports it) and, on a GPU, touch another device's memory.
TEST_F(EngineCudaRuntime, FillAndCastOfATensorOnAnotherDeviceRunOnThatDevice) {
  cuda::DeviceGuard on0(0);
  Tensor t = Tensor::empty({kN}, DType::f32, Device::cuda(2));
  t.fill_(2.5);
  cuda::set_device(0);  // fill_ made cuda:2 current, as ops do; the cast must not depend on that
  const Tensor d = t.to(DType::f64);
  EXPECT_EQ(d.device(), Device::cuda(2));
  EXPECT_EQ(d.to(Device::cpu()).to_vector<double>(), std::vector<double>(size_t(kN), 2.5));
  EXPECT_TRUE(all_equal(t, 2.5f));
}

TEST_F(EngineCudaRuntime, SetDeviceAndGuardsMoveTheEmulatedCurrentDevice) {
  cuda::DeviceGuard on0(0);
  cuda::set_device(2);
  EXPECT_EQ(emulated_device(), 2);
  EXPECT_EQ(cuda::current_device(), 2);
  {
    cuda::DeviceGuard guard(Device::cuda(1));
    EXPECT_EQ(guard.original_device(), 2);
    EXPECT_EQ(emulated_device(), 1);
  }
  EXPECT_EQ(emulated_device(), 2) << "DeviceGuard did not restore the device";
  {
    cuda::DeviceGuard cpu(Device::cpu());
    EXPECT_EQ(cpu.original_device(), -1) << "a CPU guard has nothing to restore";
    EXPECT_EQ(emulated_device(), 2);
  }
  expect_error([] { cuda::set_device(3); },
               "cannot set the current device on cuda:3: that device does not exist (3 CUDA "
               "devices visible)");
  EXPECT_EQ(emulated_device(), 2);
}

// ---- Streams ----

TEST_F(EngineCudaRuntime, StreamsNameThemselvesAndQueryTheirWork) {
  const cuda::Stream def = cuda::default_stream(1);
  EXPECT_TRUE(def.is_default());
  EXPECT_EQ(def.str(), "cuda:1/default");
  const cuda::Stream pooled = cuda::pooled_stream(1);
  EXPECT_FALSE(pooled.is_default());
  EXPECT_EQ(pooled.str().rfind("cuda:1/0x", 0), 0u) << pooled.str();
  expect_error([] { cuda::default_stream(5); }, "cannot use a stream on cuda:5");

  cuda::set_current_stream(pooled);
  EXPECT_EQ(cuda::current_stream(1), pooled);
  cuda::set_current_stream(def);
  EXPECT_EQ(cuda::current_stream(1), def);

  StreamGate gate;
  ASSERT_EQ(gate.hold(static_cast<cudaStream_t>(pooled.handle())), cudaSuccess);
  EXPECT_FALSE(pooled.query()) << "the stream's gate is still held";
  gate.release();
  pooled.synchronize();
  EXPECT_TRUE(pooled.query());
  EXPECT_FALSE(gate.timed_out());
}

TEST_F(EngineCudaRuntime, StreamGuardSetsStreamAndDeviceAndRestoresBoth) {
  cuda::DeviceGuard on0(0);
  const cuda::Stream pooled = cuda::pooled_stream(1);
  {
    cuda::StreamGuard guard(pooled);
    EXPECT_EQ(emulated_device(), 1);
    EXPECT_EQ(cuda::current_stream(1), pooled);
    EXPECT_EQ(cuda::current_stream(), pooled) << "the current device's current stream";
  }
  EXPECT_EQ(emulated_device(), 0) << "StreamGuard did not restore the device";
  EXPECT_EQ(cuda::current_stream(1), cuda::default_stream(1));
}

// Tensor::to between devices: the copy runs on the destination's current stream after the
// source's stream (Stream::wait), and the source's stream waits for the copy before it may
// overwrite the source. The source's stream is held while everything is queued, so without either
// wait the race detector reports the copy and the fills (and the values come out wrong).
TEST_F(EngineCudaRuntime, CopyBetweenDevicesIsOrderedWithBothDevicesStreams) {
  RG_REQUIRE_CONCURRENT_STREAMS();
  const cuda::Stream s0 = cuda::pooled_stream(0);
  cuda::StreamGuard on_s0(s0);
  StreamGate gate;
  Tensor a = Tensor::empty({kN}, DType::f32, Device::cuda(0));
  ASSERT_EQ(gate.hold(static_cast<cudaStream_t>(s0.handle())), cudaSuccess);
  a.fill_(3.0);
  Tensor b = a.to(Device::cuda(1));
  a.fill_(7.0);  // on s0 again: after the copy has read a
  EXPECT_FALSE(cuda::current_stream(1).query()) << "the copy ran before the source was written";
  gate.release();
  cuda::current_stream(1).synchronize();
  s0.synchronize();
  EXPECT_EQ(b.device(), Device::cuda(1));
  EXPECT_TRUE(all_equal(b, 3.0f));
  EXPECT_TRUE(all_equal(a, 7.0f));
  EXPECT_FALSE(gate.timed_out());
}

// ---- Events ----

TEST_F(EngineCudaRuntime, EventsSynchronizeTimeAndMove) {
  RG_REQUIRE_CONCURRENT_STREAMS();
  const cuda::Stream s = cuda::pooled_stream(0);
  cuda::StreamGuard on_s(s);
  cuda::Event start(/*enable_timing=*/true), end(/*enable_timing=*/true);
  start.record();  // the current stream: s
  StreamGate gate;
  ASSERT_EQ(gate.hold(static_cast<cudaStream_t>(s.handle())), cudaSuccess);
  end.record();
  EXPECT_FALSE(end.query());
  const auto t0 = std::chrono::steady_clock::now();
  std::thread opener([&] {
    std::this_thread::sleep_for(100ms);
    gate.release();
  });
  end.synchronize();
  const auto waited = std::chrono::steady_clock::now() - t0;
  opener.join();
  EXPECT_TRUE(end.query());
  EXPECT_GE(waited, 80ms) << "synchronize returned before the event was reached";
  const float ms = start.elapsed_ms(end);
  EXPECT_GE(ms, 80.0f) << "the held gate lies between the two events";
  EXPECT_LT(ms, 10000.0f);

  // A moved event keeps its CUDA event; the one moved from is empty (never recorded).
  cuda::Event moved(std::move(end));
  EXPECT_TRUE(moved.recorded());
  EXPECT_FALSE(end.recorded());  // NOLINT(bugprone-use-after-move): that is what is checked
  EXPECT_TRUE(end.query());
  EXPECT_GE(start.elapsed_ms(moved), ms);
  cuda::Event assigned(/*enable_timing=*/true);
  assigned.record(s);
  assigned = std::move(moved);
  EXPECT_TRUE(assigned.recorded());
  EXPECT_FALSE(moved.recorded());  // NOLINT(bugprone-use-after-move)
  EXPECT_GE(start.elapsed_ms(assigned), ms) << "the assigned event is end's";
  cuda::Event& same = assigned;
  assigned = std::move(same);  // a self-move leaves it alone
  EXPECT_TRUE(assigned.recorded());
}

TEST_F(EngineCudaRuntime, ElapsedTimeNeedsTwoRecordedTimingEventsOfOneDevice) {
  cuda::Event plain, timed0(true), timed1(true), never(true);
  plain.record(cuda::current_stream(0));
  timed0.record(cuda::current_stream(0));
  timed1.record(cuda::current_stream(1));
  expect_error([&] { plain.elapsed_ms(timed0); }, "created with enable_timing=true");
  expect_error([&] { timed0.elapsed_ms(never); }, "both events must have been recorded");
  expect_error([&] { timed0.elapsed_ms(timed1); }, "recorded on cuda:0 and cuda:1");
}

// ---- The caching allocator ----

TEST_F(EngineCudaRuntime, CachingAllocatorStatsBlockSizesAndEmptyCache) {
  constexpr int kDev = 2;
  cuda::empty_cache();
  const cuda::DeviceMemoryStats before = cuda::memory_stats(kDev);
  cuda::CachingAllocator& alloc = cuda::runtime().device_allocator(kDev);
  void* small_ptr = nullptr;
  void* large_ptr = nullptr;
  {
    Tensor small = Tensor::empty({kN}, DType::f32, Device::cuda(kDev));
    small_ptr = small.raw_data();
    EXPECT_EQ(alloc.block_size(small_ptr), 4096u) << "4000 bytes round up to 512-byte units";
    // 11.5 MiB: a segment of its own, rounded up to 2 MiB.
    Tensor large = Tensor::empty({int64_t(23 * kMiB / 2)}, DType::u8, Device::cuda(kDev));
    large_ptr = large.raw_data();
    EXPECT_EQ(alloc.block_size(large_ptr), 12 * kMiB);
    const cuda::DeviceMemoryStats s = cuda::memory_stats(kDev);
    EXPECT_EQ(s.allocated_bytes - before.allocated_bytes, int64_t(4096 + 12 * kMiB));
    EXPECT_EQ(s.requested_bytes - before.requested_bytes, int64_t(4000 + 23 * kMiB / 2));
    EXPECT_EQ(s.reserved_bytes - before.reserved_bytes, int64_t(2 * kMiB + 12 * kMiB));
    EXPECT_EQ(s.num_allocs - before.num_allocs, 2);
    EXPECT_EQ(s.num_device_allocs - before.num_device_allocs, 2);
    EXPECT_GE(s.peak_allocated_bytes, s.allocated_bytes);
    EXPECT_EQ(emu::memory_owner(large_ptr), kDev);
  }
  cuda::reset_peak_memory_stats(kDev);
  const cuda::DeviceMemoryStats freed = cuda::memory_stats(kDev);
  EXPECT_EQ(freed.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(freed.peak_allocated_bytes, freed.allocated_bytes) << "reset_peak_memory_stats";
  EXPECT_EQ(freed.peak_reserved_bytes, freed.reserved_bytes);
  EXPECT_EQ(freed.reserved_bytes, before.reserved_bytes + int64_t(14 * kMiB)) << "kept cached";
  expect_error([&] { alloc.block_size(small_ptr); }, "is not the start of a live block");

  cuda::empty_cache();
  const cuda::DeviceMemoryStats emptied = cuda::memory_stats(kDev);
  EXPECT_EQ(emptied.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(emptied.num_device_frees - before.num_device_frees, 2);
  EXPECT_EQ(emu::memory_owner(large_ptr), -2) << "the segment was not given back to the device";
  EXPECT_EQ(emu::memory_owner(small_ptr), -2);
  expect_error([] { cuda::memory_stats(7); },
               "cannot use the caching allocator on cuda:7: that device does not exist");
}

// An allocation the device cannot hold: the cache is released and the allocation retried once,
// then the error says what was asked for and what is held. The device works on afterwards.
TEST_F(EngineCudaRuntime, OutOfMemoryReleasesTheCacheRetriesAndNamesTheSizes) {
  constexpr int kDev = 2;
  cuda::empty_cache();
  Tensor live = filled(kN, 4.0, kDev);  // in a 2 MiB segment that cannot be released
  const cuda::DeviceMemoryStats before = cuda::memory_stats(kDev);
  // 2^56 bytes, the most the allocator accepts: more than any address space.
  const int64_t huge = int64_t(1) << 56;
  const std::string e = error_of([&] { Tensor::empty({huge}, DType::u8, Device::cuda(kDev)); });
  EXPECT_NE(e.find("CUDA out of memory on cuda:2: tried to allocate 65536.00 TiB with 4.00 KiB "
                   "allocated to tensors and 2.00 MiB reserved by the caching allocator (the "
                   "cache was already released)"),
            std::string::npos)
      << e;
  const cuda::DeviceMemoryStats after = cuda::memory_stats(kDev);
  EXPECT_EQ(after.num_cache_flushes - before.num_cache_flushes, 1);
  EXPECT_EQ(after.num_device_allocs, before.num_device_allocs);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes) << "a segment in use was released";
  EXPECT_EQ(emu::memory_owner(live.raw_data()), kDev);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failed cudaMalloc's error was left pending";
  EXPECT_TRUE(all_equal(live, 4.0f));
  EXPECT_TRUE(all_equal(filled(kN, 5.0, kDev), 5.0f)) << "the device is unusable after the OOM";
}

TEST_F(EngineCudaRuntime, OutOfMemoryReturnsWholeCachedSegmentsBeforeFailing) {
  constexpr int kDev = 1;
  cuda::empty_cache();
  void* cached_ptr = nullptr;
  { cached_ptr = filled(int64_t(kMiB), 1.0, kDev).raw_data(); }  // 4 MiB: a 20 MiB segment
  const cuda::DeviceMemoryStats before = cuda::memory_stats(kDev);
  ASSERT_EQ(emu::memory_owner(cached_ptr), kDev);
  const std::string e =
      error_of([&] { Tensor::empty({int64_t(1) << 56}, DType::u8, Device::cuda(kDev)); });
  EXPECT_NE(e.find("CUDA out of memory on cuda:1"), std::string::npos) << e;
  const cuda::DeviceMemoryStats after = cuda::memory_stats(kDev);
  EXPECT_EQ(after.num_device_frees - before.num_device_frees, 1);
  EXPECT_EQ(before.reserved_bytes - after.reserved_bytes, int64_t(20 * kMiB));
  EXPECT_EQ(emu::memory_owner(cached_ptr), -2) << "the cached segment was not released";
}

// A block that another stream used (record_stream) goes back to its pool only once that stream's
// work is done; empty_cache waits for it.
TEST_F(EngineCudaRuntime, RecordStreamDefersReuseUntilTheOtherStreamIsDone) {
  RG_REQUIRE_CONCURRENT_STREAMS();
  constexpr int kDev = 1;
  cuda::empty_cache();
  const cuda::Stream other = cuda::pooled_stream(kDev);
  StreamGate gate;
  void* first = nullptr;
  {
    Tensor t = filled(kN, 1.0, kDev);  // on cuda:1's current (default) stream
    first = t.raw_data();
    ASSERT_EQ(gate.hold(static_cast<cudaStream_t>(other.handle())), cudaSuccess);
    other.wait(cuda::current_stream(kDev));
    cuda::record_stream(t, other);
  }
  EXPECT_EQ(cuda::memory_stats(kDev).pending_free_blocks, 1);
  Tensor second = Tensor::empty({kN}, DType::f32, Device::cuda(kDev));
  EXPECT_NE(second.raw_data(), first) << "reused while the other stream may still use it";
  std::thread opener([&] {
    std::this_thread::sleep_for(50ms);
    gate.release();
  });
  cuda::empty_cache();  // waits for the event behind the gate
  opener.join();
  EXPECT_EQ(cuda::memory_stats(kDev).pending_free_blocks, 0);
  Tensor third = Tensor::empty({kN}, DType::f32, Device::cuda(kDev));
  EXPECT_EQ(third.raw_data(), first) << "the block did not go back to its pool";
  EXPECT_FALSE(gate.timed_out());
}

// ---- The pinned allocator ----

TEST_F(EngineCudaRuntime, PinnedBlocksAreCachedBySizeClassAndReusedAfterTheirCopies) {
  RG_REQUIRE_CONCURRENT_STREAMS();
  cuda::empty_cache();
  const cuda::HostMemoryStats before = cuda::pinned_memory_stats();
  // 100000 bytes: 25 pages, then the size class of 1/8 of 64 KiB steps.
  EXPECT_EQ(cuda::PinnedAllocator::size_class(100000), 106496u);
  void* first = nullptr;
  {
    Tensor h = Tensor::empty_pinned({25000}, DType::f32);
    first = h.raw_data();
    EXPECT_TRUE(h.is_pinned());
    EXPECT_EQ(emu::memory_owner(first), -1);
  }
  const cuda::HostMemoryStats cached = cuda::pinned_memory_stats();
  EXPECT_EQ(cached.num_host_allocs - before.num_host_allocs, 1);
  EXPECT_EQ(cached.reserved_bytes - before.reserved_bytes, 106496);
  EXPECT_EQ(cached.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(cached.peak_allocated_bytes, before.allocated_bytes + 106496);

  // The same class again: the cached block, no cudaHostAlloc.
  const cuda::Stream s = cuda::pooled_stream(0);
  cuda::StreamGuard on_s(s);
  StreamGate gate;
  Tensor device;
  {
    Tensor h = Tensor::empty_pinned({26000}, DType::f32);
    EXPECT_EQ(h.raw_data(), first);
    EXPECT_EQ(cuda::pinned_memory_stats().num_host_allocs, cached.num_host_allocs);
    h.fill_(6.0);
    ASSERT_EQ(gate.hold(static_cast<cudaStream_t>(s.handle())), cudaSuccess);
    device = h.to(Device::cuda(0), /*non_blocking=*/true);  // queued behind the gate
  }
  EXPECT_EQ(cuda::pinned_memory_stats().pending_free_blocks, 1);
  {
    Tensor h = Tensor::empty_pinned({26000}, DType::f32);
    EXPECT_NE(h.raw_data(), first) << "a pinned block was reused before its copy ran";
  }
  gate.release();
  s.synchronize();
  {
    Tensor h = Tensor::empty_pinned({26000}, DType::f32);
    EXPECT_EQ(h.raw_data(), first) << "the block was not reused once its copy was done";
    EXPECT_EQ(cuda::pinned_memory_stats().pending_free_blocks, 0);
  }
  EXPECT_TRUE(all_equal(device, 6.0f));
  EXPECT_FALSE(gate.timed_out());

  cuda::empty_cache();
  const cuda::HostMemoryStats emptied = cuda::pinned_memory_stats();
  EXPECT_EQ(emptied.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(emptied.num_host_frees - before.num_host_frees, 2);
  EXPECT_EQ(emu::memory_owner(first), -2) << "empty_cache did not unpin the cached block";
  cuda::runtime().pinned_allocator().reset_peak_stats();
  EXPECT_EQ(cuda::pinned_memory_stats().peak_allocated_bytes, emptied.allocated_bytes);
}

// cuda::empty_cache during a capture on one device empties nothing: not the other devices'
// caches, not the pinned one.
TEST_F(EngineCudaRuntime, EmptyCacheDuringACaptureOnOneDeviceEmptiesNothing) {
  { Tensor cached = Tensor::empty({kN}, DType::f32, Device::cuda(0)); }
  { Tensor cached = Tensor::empty_pinned({kN}, DType::f32); }
  const int64_t reserved = cuda::memory_stats(0).reserved_bytes;
  const int64_t pinned = cuda::pinned_memory_stats().reserved_bytes;
  ASSERT_GT(reserved, 0);
  ASSERT_GT(pinned, 0);
  cuda::DeviceGuard on(Device::cuda(1));
  const cuda::Stream stream = cuda::pooled_stream(1);
  cuda::StreamGuard use(stream);
  Tensor x = full({kN}, 1.0, DType::f32, Device::cuda(1));
  stream.synchronize();
  std::string error;
  Tensor out;
  cuda::Graph graph(Device::cuda(1), [&] {
    out = add(x, x);
    error = error_of([] { cuda::empty_cache(); });
  });
  EXPECT_NE(error.find("cuda::empty_cache during a CUDA graph capture on cuda:1: nothing was "
                       "emptied"),
            std::string::npos)
      << error;
  EXPECT_EQ(cuda::memory_stats(0).reserved_bytes, reserved);
  EXPECT_EQ(cuda::pinned_memory_stats().reserved_bytes, pinned);
  graph.replay();
  stream.synchronize();
  EXPECT_TRUE(all_equal(out, 2.0f));
}

TEST_F(EngineCudaRuntime, EmptyCacheWaitsForACopyThatStillUsesAPinnedBlock) {
  RG_REQUIRE_CONCURRENT_STREAMS();
  cuda::empty_cache();
  const cuda::HostMemoryStats before = cuda::pinned_memory_stats();
  const cuda::Stream s = cuda::pooled_stream(0);
  cuda::StreamGuard on_s(s);
  StreamGate gate;
  Tensor device = Tensor::empty({kN}, DType::f32, Device::cuda(0));
  void* pinned = nullptr;
  {
    Tensor h = Tensor::empty_pinned({kN}, DType::f32);
    pinned = h.raw_data();
    h.fill_(8.0);
    ASSERT_EQ(gate.hold(static_cast<cudaStream_t>(s.handle())), cudaSuccess);
    device.copy_(h, /*non_blocking=*/true);
  }
  ASSERT_EQ(cuda::pinned_memory_stats().pending_free_blocks, 1);
  std::thread opener([&] {
    std::this_thread::sleep_for(50ms);
    gate.release();
  });
  cuda::empty_cache();
  opener.join();
  const cuda::HostMemoryStats after = cuda::pinned_memory_stats();
  EXPECT_EQ(after.pending_free_blocks, 0);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(emu::memory_owner(pinned), -2);
  EXPECT_TRUE(all_equal(device, 8.0f));
  EXPECT_FALSE(gate.timed_out());
}

// ---- Pinned memory and CUDA graphs ----

// A captured copy reads its pinned source at every replay: the block belongs to the graph until
// the graph is destroyed, whether it is freed during the capture or after it (a block reused
// meanwhile would feed the replays someone else's data), then it comes back once the replay's
// stream has passed.
TEST_F(EngineCudaRuntime, APinnedBlockACapturedCopyReadsIsKeptUntilTheGraphIsDestroyed) {
  for (const bool free_in_capture : {true, false}) {
    SCOPED_TRACE(free_in_capture ? "freed during the capture" : "freed after the capture");
    const cuda::Stream stream = cuda::pooled_stream(0);
    cuda::StreamGuard on(stream);
    constexpr int64_t kPinned = 3000;  // 12000 bytes: a size class no other test here uses
    Tensor h = Tensor::empty_pinned({kPinned}, DType::f32);
    h.fill_(1.0);
    void* const held = h.raw_data();
    Tensor d;
    auto graph = std::make_unique<cuda::Graph>(Device::cuda(0), [&] {
      d = h.to(Device::cuda(0), /*non_blocking=*/true);
      if (free_in_capture) h = Tensor();
    });
    h = Tensor();
    stream.synchronize();  // an event recorded on the capture's stream would have been reached
    Tensor other = Tensor::empty_pinned({kPinned}, DType::f32);  // queries the pinned events
    EXPECT_NE(other.raw_data(), held) << "the graph's pinned block was handed out again";
    other.fill_(7.0);
    graph->replay();
    stream.synchronize();
    EXPECT_TRUE(all_equal(d, 1.0f)) << "the replay read another tensor's data";
    other = Tensor();
    graph.reset();
    stream.synchronize();  // the events its release recorded on the replay's stream
    const Tensor after = Tensor::empty_pinned({kPinned}, DType::f32);
    const Tensor again = Tensor::empty_pinned({kPinned}, DType::f32);
    EXPECT_TRUE(after.raw_data() == held || again.raw_data() == held)
        << "the block did not come back after the graph";
  }
  EXPECT_EQ(cuda::pinned_memory_stats().pending_free_blocks, 0);
}

// One pinned block read by the captured copies of two graphs: it is the graphs' until both are
// destroyed (the second's replays still read it after the first is gone).
TEST_F(EngineCudaRuntime, APinnedBlockTwoGraphsReadIsKeptUntilBothAreDestroyed) {
  const cuda::Stream stream = cuda::pooled_stream(0);
  cuda::StreamGuard on(stream);
  constexpr int64_t kPinned = 7000;  // 28000 bytes: its own size class
  Tensor h = Tensor::empty_pinned({kPinned}, DType::f32);
  h.fill_(5.0);
  void* const held = h.raw_data();
  Tensor da, db;
  auto a = std::make_unique<cuda::Graph>(
      Device::cuda(0), [&] { da = h.to(Device::cuda(0), /*non_blocking=*/true); });
  auto b = std::make_unique<cuda::Graph>(
      Device::cuda(0), [&] { db = h.to(Device::cuda(0), /*non_blocking=*/true); });
  h = Tensor();
  a.reset();
  stream.synchronize();
  {
    Tensor other = Tensor::empty_pinned({kPinned}, DType::f32);
    EXPECT_NE(other.raw_data(), held) << "handed out while the second graph still reads it";
    other.fill_(9.0);
    b->replay();
    stream.synchronize();
  }
  EXPECT_TRUE(all_equal(db, 5.0f));
  b.reset();
  stream.synchronize();
  const Tensor x = Tensor::empty_pinned({kPinned}, DType::f32);
  const Tensor y = Tensor::empty_pinned({kPinned}, DType::f32);
  EXPECT_TRUE(x.raw_data() == held || y.raw_data() == held) << "not back after both graphs";
  EXPECT_EQ(cuda::pinned_memory_stats().pending_free_blocks, 0);
}

// Two cuda::Graphs capturing at the same time on two devices, from two threads, each reading its
// own pinned block and freeing it during its capture: each block is its own graph's (credited to
// the capture of the stream's device), neither is handed out while its graph lives, each graph's
// replay reads its own data, and each block comes back when its own graph is destroyed, not when
// the other one is.
TEST_F(EngineCudaRuntime, ConcurrentCapturesOnTwoDevicesEachKeepTheirOwnPinnedBlock) {
  constexpr int64_t kSize[2] = {5000, 9000};  // 20000 and 36000 bytes: their own size classes
  void* held[2] = {nullptr, nullptr};
  std::unique_ptr<cuda::Graph> graph[2];
  Tensor out[2];
  std::latch both_capturing(2), both_copied(2);
  auto capture = [&](int d) {
    cuda::DeviceGuard on(Device::cuda(d));
    const cuda::Stream stream = cuda::pooled_stream(d);
    cuda::StreamGuard use(stream);
    Tensor h = Tensor::empty_pinned({kSize[d]}, DType::f32);
    h.fill_(double(d + 1));
    held[d] = h.raw_data();
    graph[d] = std::make_unique<cuda::Graph>(Device::cuda(d), [&] {
      both_capturing.arrive_and_wait();  // the other device's capture has begun too
      out[d] = h.to(Device::cuda(d), /*non_blocking=*/true);
      h = Tensor();                   // freed during the capture
      both_copied.arrive_and_wait();  // and goes on until both copies are captured
    });
    stream.synchronize();
  };
  std::thread t0(capture, 0), t1(capture, 1);
  t0.join();
  t1.join();
  ASSERT_TRUE(graph[0] && graph[1]);
  // Neither block is handed out while its graph lives.
  for (int d : {0, 1}) {
    Tensor other = Tensor::empty_pinned({kSize[d]}, DType::f32);
    EXPECT_NE(other.raw_data(), held[d]) << "cuda:" << d << "'s graph's block was handed out";
    other.fill_(9.0);
    cuda::DeviceGuard on(Device::cuda(d));
    graph[d]->replay();
    cuda::current_stream(d).synchronize();
    EXPECT_TRUE(all_equal(out[d], float(d + 1))) << "cuda:" << d << "'s replay read other data";
  }
  // Destroying cuda:0's graph gives back its block only.
  graph[0].reset();
  synchronize_all();
  auto comes_back = [&](int d) {
    const Tensor a = Tensor::empty_pinned({kSize[d]}, DType::f32);
    const Tensor b = Tensor::empty_pinned({kSize[d]}, DType::f32);
    return a.raw_data() == held[d] || b.raw_data() == held[d];
  };
  EXPECT_TRUE(comes_back(0)) << "cuda:0's block did not come back after its graph";
  EXPECT_FALSE(comes_back(1)) << "cuda:1's block came back while its graph lives";
  graph[1].reset();
  synchronize_all();
  EXPECT_TRUE(comes_back(1)) << "cuda:1's block did not come back after its graph";
  EXPECT_EQ(cuda::pinned_memory_stats().pending_free_blocks, 0);
}

// A pinned block a side stream used, freed by another thread while that stream has joined a
// capture: the event its free would record could be captured and fail every later query, so it
// waits for the capture's end; and allocating pinned memory in a capture while frees are still
// pending queries no event (that would invalidate the capture).
// A graph replayed on another stream than its capture's: its pinned block comes back only after
// that stream has passed the replay, not when the capture's stream has.
TEST_F(EngineCudaRuntime, APinnedBlockOfAGraphReplayedOnAnotherStreamWaitsForThatStream) {
  RG_REQUIRE_CONCURRENT_STREAMS();
  const cuda::Stream stream = cuda::pooled_stream(0);
  const cuda::Stream elsewhere = cuda::pooled_stream(0);
  cuda::StreamGuard on(stream);
  constexpr int64_t kPinned = 9000;  // 36000 bytes: its own size class
  Tensor h = Tensor::empty_pinned({kPinned}, DType::f32);
  h.fill_(6.0);
  void* const held = h.raw_data();
  Tensor d;
  auto graph = std::make_unique<cuda::Graph>(
      Device::cuda(0), [&] { d = h.to(Device::cuda(0), /*non_blocking=*/true); });
  stream.synchronize();
  StreamGate gate;
  ASSERT_EQ(gate.hold(static_cast<cudaStream_t>(elsewhere.handle())), cudaSuccess);
  {
    cuda::StreamGuard replay_there(elsewhere);
    graph->replay();  // waits behind the gate
  }
  h = Tensor();
  graph.reset();
  stream.synchronize();
  const Tensor during = Tensor::empty_pinned({kPinned}, DType::f32);  // queries the events
  EXPECT_NE(during.raw_data(), held) << "reused before the replay's stream passed it";
  gate.release();
  elsewhere.synchronize();
  EXPECT_TRUE(all_equal(d, 6.0f));
  const Tensor after = Tensor::empty_pinned({kPinned}, DType::f32);
  EXPECT_EQ(after.raw_data(), held) << "the block did not come back after the replay";
  EXPECT_FALSE(gate.timed_out());
}

// A capture body that throws after a pinned copy: the Graph's constructor throws the body's
// error, and the pinned allocator is left with no capture and no graph holding the block (it
// comes back once the capture's stream has passed, the next capture works, empty_cache too).
TEST_F(EngineCudaRuntime, ACaptureThatThrowsAfterAPinnedCopyLeavesNoGraphHoldingTheBlock) {
  const cuda::Stream stream = cuda::pooled_stream(0);
  cuda::StreamGuard on(stream);
  constexpr int64_t kPinned = 11000;  // 44000 bytes: its own size class
  Tensor h = Tensor::empty_pinned({kPinned}, DType::f32);
  h.fill_(2.0);
  void* const held = h.raw_data();
  Tensor d;
  const std::string error = error_of([&] {
    cuda::Graph graph(Device::cuda(0), [&] {
      d = h.to(Device::cuda(0), /*non_blocking=*/true);
      RG_FAIL("the body fails after its pinned copy");
    });
  });
  EXPECT_NE(error.find("the body fails after its pinned copy"), std::string::npos) << error;
  EXPECT_FALSE(cuda::runtime().pinned_allocator().capturing());
  d = Tensor();
  h = Tensor();
  stream.synchronize();
  const Tensor again = Tensor::empty_pinned({kPinned}, DType::f32);
  EXPECT_EQ(again.raw_data(), held) << "a failed capture kept the block";
  EXPECT_EQ(cuda::pinned_memory_stats().pending_free_blocks, 0);
  Tensor x = full({kN}, 1.0, DType::f32, Device::cuda(0));
  stream.synchronize();
  Tensor out;
  cuda::Graph next(Device::cuda(0), [&] { out = add(x, x); });
  next.replay();
  stream.synchronize();
  EXPECT_TRUE(all_equal(out, 2.0f));
  cuda::empty_cache();
}

TEST_F(EngineCudaRuntime, PinnedFreesAndAllocationsDuringACaptureQueryNoEvent) {
  RG_REQUIRE_CONCURRENT_STREAMS();
  const cuda::Stream stream = cuda::pooled_stream(0);
  const cuda::Stream side = cuda::pooled_stream(0);
  const cuda::Stream copier = cuda::pooled_stream(0);
  cuda::StreamGuard on(stream);
  constexpr int64_t kPinned = 5000;  // 20000 bytes: its own size class
  Tensor x = full({kN}, 2.0, DType::f32, Device::cuda(0));
  Tensor used = Tensor::empty_pinned({kPinned}, DType::f32);
  cuda::record_stream(used, side);
  StreamGate gate;
  Tensor pending_copy = Tensor::empty({kPinned}, DType::f32, Device::cuda(0));
  stream.synchronize();
  {
    Tensor pending = Tensor::empty_pinned({kPinned}, DType::f32);
    pending.fill_(3.0);
    ASSERT_EQ(gate.hold(static_cast<cudaStream_t>(copier.handle())), cudaSuccess);
    cuda::StreamGuard on_copier(copier);
    pending_copy.copy_(pending, /*non_blocking=*/true);  // waits behind the gate
  }
  ASSERT_EQ(cuda::pinned_memory_stats().pending_free_blocks, 1);
  Tensor out;
  std::string empty_cache_error;
  cuda::Graph graph(Device::cuda(0), [&] {
    const Tensor made = Tensor::empty_pinned({kPinned}, DType::f32);  // no event is queried
    empty_cache_error = error_of([] { cuda::runtime().pinned_allocator().empty_cache(); });
    cuda::Event fork;
    fork.record(stream);
    fork.wait(side);  // the side stream joins the capture
    std::thread([&] { used = Tensor(); }).join();
    cuda::Event join;
    join.record(side);
    join.wait(stream);
    out = add(x, x);
  });
  EXPECT_NE(empty_cache_error.find("pinned empty_cache during a CUDA graph capture"),
            std::string::npos)
      << empty_cache_error;
  gate.release();
  graph.replay();
  copier.synchronize();
  side.synchronize();
  stream.synchronize();
  const Tensor after = Tensor::empty_pinned({kPinned}, DType::f32);  // processes the events
  EXPECT_TRUE(all_equal(out, 4.0f));
  EXPECT_TRUE(all_equal(pending_copy, 3.0f));
  EXPECT_FALSE(gate.timed_out());
  EXPECT_EQ(cuda::pinned_memory_stats().pending_free_blocks, 0);
  cuda::runtime().pinned_allocator().empty_cache();  // usable again after the capture
}

// Pinned memory used on a stream captured by something other than a cuda::Graph: the allocator
// could not keep the block for that capture's replays, so the copy is refused before it is queued.
TEST_F(EngineCudaRuntime, APinnedCopyOnARawStreamCaptureIsRefusedByName) {
  const cuda::Stream side = cuda::pooled_stream(0);
  cuda::StreamGuard on(side);
  Tensor h = Tensor::empty_pinned({kN}, DType::f32);
  h.fill_(2.0);
  Tensor d = Tensor::empty({kN}, DType::f32, Device::cuda(0));
  cuda::Backend& backend = cuda::runtime().backend();
  Tensor refused = Tensor::empty_pinned({kN}, DType::f32);
  backend.begin_capture(0, side.handle());
  const std::string e = error_of([&] { d.copy_(refused, /*non_blocking=*/true); });
  refused = Tensor();  // had its use been noted, this free would record an event into the capture
  const cuda::GraphHandle raw = backend.end_capture(0, side.handle());
  backend.destroy_graph(0, raw);
  EXPECT_NE(e.find("captured by something other than rg::cuda::Graph"), std::string::npos) << e;
  d.copy_(h, /*non_blocking=*/true);
  side.synchronize();
  const Tensor later = Tensor::empty_pinned({kN}, DType::f32);  // queries the pinned events
  EXPECT_TRUE(all_equal(d, 2.0f));
}

// A raw capture begun on a stream after a pinned copy was queued there: the block's free must not
// record its event into that capture (the event would fail every later query, and so every
// pinned allocation); it waits, and the first allocation after the capture frees it.
TEST_F(EngineCudaRuntime, APinnedBlockFreedDuringARawCaptureOfItsStreamWaitsForItsEnd) {
  const cuda::Stream side = cuda::pooled_stream(0);
  cuda::StreamGuard on(side);
  Tensor h = Tensor::empty_pinned({kN}, DType::f32);
  h.fill_(5.0);
  Tensor d = Tensor::empty({kN}, DType::f32, Device::cuda(0));
  d.copy_(h, /*non_blocking=*/true);
  side.synchronize();
  cuda::Backend& backend = cuda::runtime().backend();
  const int64_t pending = cuda::pinned_memory_stats().pending_free_blocks;
  backend.begin_capture(0, side.handle());
  h = Tensor();
  EXPECT_EQ(cuda::pinned_memory_stats().pending_free_blocks, pending + 1);
  const cuda::GraphHandle raw = backend.end_capture(0, side.handle());
  backend.destroy_graph(0, raw);
  const Tensor next = Tensor::empty_pinned({kN}, DType::f32);  // frees it: records its event
  side.synchronize();
  const Tensor later = Tensor::empty_pinned({kN}, DType::f32);  // queries it
  EXPECT_EQ(cuda::pinned_memory_stats().pending_free_blocks, pending);
  EXPECT_TRUE(all_equal(d, 5.0f));
}

TEST_F(EngineCudaRuntime, PinnedOutOfMemoryUnpinsTheCacheAndSaysHowMuchIsPinned) {
  cuda::empty_cache();
  void* cached = nullptr;
  { cached = Tensor::empty_pinned({kN}, DType::f32).raw_data(); }
  const cuda::HostMemoryStats before = cuda::pinned_memory_stats();
  const std::string e = error_of([] { Tensor::empty_pinned({int64_t(1) << 56}, DType::u8); });
  EXPECT_NE(e.find("out of pinned host memory allocating 72057594037927936 bytes"),
            std::string::npos)
      << e;
  EXPECT_EQ(cuda::pinned_memory_stats().num_host_frees - before.num_host_frees, 1);
  EXPECT_EQ(emu::memory_owner(cached), -2) << "the cached pinned block was not released first";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_TRUE(Tensor::empty_pinned({kN}, DType::f32).is_pinned());
}

TEST_F(EngineCudaRuntime, RecordStreamTakesCudaAndPinnedTensorsOnly) {
  const cuda::Stream s = cuda::pooled_stream(0);
  expect_error([&] { cuda::record_stream(Tensor::empty({4}), s); },
               "the tensor is in pageable CPU memory");
  expect_error([&] { cuda::record_stream(Tensor::empty({4}, DType::f32, Device::cuda(1)), s); },
               "a tensor on cuda:1 cannot be used by stream cuda:0/");
  // A pinned block named for a stream waits for that stream when freed, even without a copy.
  Tensor h = Tensor::empty_pinned({kN}, DType::f32);
  cuda::record_stream(h, s);
  const int64_t pending = cuda::pinned_memory_stats().pending_free_blocks;
  h = Tensor();
  EXPECT_EQ(cuda::pinned_memory_stats().pending_free_blocks, pending + 1);
  s.synchronize();
  cuda::empty_cache();
  EXPECT_EQ(cuda::pinned_memory_stats().pending_free_blocks, 0);
}

// ---- A runtime's teardown ----

// The process's runtime is never destroyed, but a runtime's allocators give everything back when
// it is: cached segments, blocks still handed out, and cached pinned blocks.
// ---- CUDA graphs (engine/cuda/graph.h) ----

// In-place work on tensors made before the capture: nothing runs at capture, every replay runs
// it all again.
TEST_F(EngineCudaRuntime, AGraphReplaysInPlaceWorkOnTensorsMadeBeforeTheCapture) {
  const cuda::Stream stream = cuda::pooled_stream(0);
  cuda::StreamGuard on(stream);
  Tensor x = full({kN}, 3.0, DType::f32, Device::cuda(0));
  Tensor y = full({kN}, 1.0, DType::f32, Device::cuda(0));
  stream.synchronize();
  cuda::Graph graph(Device::cuda(0), [&] {
    add_(y, x);    // y += 3
    mul_(y, 2.0);  // y *= 2
  });
  stream.synchronize();
  EXPECT_TRUE(all_equal(y, 1.0f)) << "the captured work ran at capture";
  graph.replay();
  graph.replay();
  stream.synchronize();
  EXPECT_TRUE(all_equal(y, 22.0f)) << "((1 + 3) * 2 + 3) * 2";
  // A moved graph replays; the moved-from one refuses.
  cuda::Graph moved(std::move(graph));
  moved.replay();
  stream.synchronize();
  EXPECT_TRUE(all_equal(y, 50.0f));
  EXPECT_NE(error_of([&] { graph.replay(); }).find("moved from"), std::string::npos);
}

// A Graph whose capture cannot begin (its stream is captured already, by a raw capture) undoes
// what it began: the device allocator's graph pool and the pinned allocator's capture count, so
// the next Graph of the device captures and pinned memory is freed at once again.
TEST_F(EngineCudaRuntime, AGraphWhoseCaptureCannotBeginLeavesNoCaptureBehind) {
  const cuda::Stream stream = cuda::pooled_stream(0);
  cuda::StreamGuard on(stream);
  Tensor x = full({kN}, 2.0, DType::f32, Device::cuda(0));
  stream.synchronize();
  cuda::Backend& backend = cuda::runtime().backend();
  backend.begin_capture(0, stream.handle());
  const std::string e = error_of([&] { cuda::Graph refused(Device::cuda(0), [] {}); });
  backend.destroy_graph(0, backend.end_capture(0, stream.handle()));
  EXPECT_FALSE(e.empty());
  Tensor h = Tensor::empty_pinned({kN}, DType::f32);
  h.fill_(1.0);
  x.copy_(h, /*non_blocking=*/true);
  const int64_t pending = cuda::pinned_memory_stats().pending_free_blocks;
  h = Tensor();  // with a capture still counted, this free would wait for its end
  stream.synchronize();
  const Tensor next = Tensor::empty_pinned({kN}, DType::f32);  // processes the copy's event
  EXPECT_EQ(cuda::pinned_memory_stats().pending_free_blocks, pending);
  Tensor out;
  cuda::Graph graph(Device::cuda(0), [&] { out = add(x, x); });
  graph.replay();
  stream.synchronize();
  EXPECT_TRUE(all_equal(out, 2.0f));
}

// What a capture allocates comes from the graph's private pool: a block freed in the capture
// serves its later allocations, what it leaves behind is a static output each replay rewrites,
// nothing eager gets the pool's memory, a tensor made before the capture and freed in it stays
// reserved while the graph lives, and the pool's segments go back once graph and outputs are gone.
TEST_F(EngineCudaRuntime, AGraphAllocatesFromItsPrivatePoolAndItsOutputsAreStatic) {
  const cuda::Stream stream = cuda::pooled_stream(0);
  cuda::StreamGuard on(stream);
  cuda::CachingAllocator& allocator = cuda::runtime().device_allocator(0);
  Tensor x = full({kN}, 2.0, DType::f32, Device::cuda(0));
  Tensor dropped = full({kN}, 5.0, DType::f32, Device::cuda(0));
  stream.synchronize();
  const void* dropped_at = dropped.raw_data();
  const int64_t before = allocator.stats().allocated_bytes;
  const int64_t device_frees = allocator.stats().num_device_frees;
  Tensor out;
  const void* first = nullptr;
  const void* second = nullptr;
  auto graph = std::make_unique<cuda::Graph>(Device::cuda(0), [&] {
    dropped = Tensor();            // made before the capture: held by the graph
    first = add(x, x).raw_data();  // freed at once: the next allocation of its size reuses it
    const Tensor t = add(x, x);
    second = t.raw_data();
    out = add(mul(t, 3.0), x);
  });
  EXPECT_EQ(first, second) << "a block freed in the capture serves its later allocations";
  EXPECT_GT(allocator.graph_pool_bytes(), 0);
  EXPECT_EQ(allocator.stats().allocated_bytes,
            before + int64_t(allocator.block_size(out.raw_data())) +
                cuda::Graph::kReplaySlots * int64_t(sizeof(int64_t)))
      << "the held block still counts, the output's block and the graph's replay slots are "
         "handed out";
  const Tensor eager = Tensor::empty({kN}, DType::f32, Device::cuda(0));
  EXPECT_NE(eager.raw_data(), dropped_at) << "a block the graph may use was handed out";
  EXPECT_NE(eager.raw_data(), second) << "the graph pool's block was handed out";
  graph->replay();
  stream.synchronize();
  EXPECT_TRUE(all_equal(out, 14.0f)) << "(2 + 2) * 3 + 2";
  x.fill_(1.0);  // the static input, refilled in place
  graph->replay();
  stream.synchronize();
  EXPECT_TRUE(all_equal(out, 7.0f)) << "(1 + 1) * 3 + 1";
  graph.reset();
  EXPECT_GT(allocator.graph_pool_bytes(), 0) << "the output still lives in the pool";
  EXPECT_EQ(allocator.stats().num_device_frees, device_frees);
  out = Tensor();
  EXPECT_EQ(allocator.graph_pool_bytes(), 0);
  EXPECT_GT(allocator.stats().num_device_frees, device_frees) << "the pool's segment went back";
  EXPECT_EQ(allocator.stats().allocated_bytes, before)
      << "x and eager remain: the block held for the graph was released with it";
}

// A capture that fails (a host-blocking call inside) is an error naming CUDA's reason; the
// stream, the allocator and the blocks the capture freed or took are usable again.
TEST_F(EngineCudaRuntime, AFailedCaptureLeavesTheAllocatorAndStreamUsable) {
  const cuda::Stream stream = cuda::pooled_stream(0);
  cuda::StreamGuard on(stream);
  cuda::CachingAllocator& allocator = cuda::runtime().device_allocator(0);
  Tensor x = full({kN}, 2.0, DType::f32, Device::cuda(0));
  Tensor dropped = full({kN}, 5.0, DType::f32, Device::cuda(0));
  stream.synchronize();
  const int64_t before = allocator.stats().allocated_bytes;
  const std::string e = error_of([&] {
    cuda::Graph graph(Device::cuda(0), [&] {
      dropped = Tensor();
      Tensor z = add(x, x);
      stream.synchronize();  // not capturable
    });
  });
  EXPECT_NE(e.find("capturing a CUDA graph on cuda:0"), std::string::npos) << e;
  EXPECT_NE(e.find("not permitted when stream is capturing"), std::string::npos) << e;
  EXPECT_EQ(allocator.graph_pool_bytes(), 0);
  EXPECT_EQ(allocator.stats().allocated_bytes, before - int64_t(kN * 4 + 511) / 512 * 512)
      << "the block freed in the failed capture was released";
  const Tensor w = add(x, x);
  stream.synchronize();
  EXPECT_TRUE(all_equal(w, 4.0f));
}

// A tensor used on a second stream (record_stream), freed by another thread while that stream has
// joined a capture (as the NCCL watchdog drops a finished collective's tensors): the event its
// free records would be captured and fail every later query (found by scripts/coverage.sh's slow
// build: every later allocation threw "operation not permitted on an event last recorded in a
// capturing stream"); it is freed when the capture ends instead.
TEST_F(EngineCudaRuntime, AFreeFromAnotherThreadDuringACaptureWaitsForItsEnd) {
  const cuda::Stream stream = cuda::pooled_stream(0);
  const cuda::Stream side = cuda::pooled_stream(0);
  cuda::StreamGuard on(stream);
  Tensor x = full({kN}, 2.0, DType::f32, Device::cuda(0));
  Tensor used = full({kN}, 1.0, DType::f32, Device::cuda(0));
  cuda::record_stream(used, side);
  stream.synchronize();
  Tensor out;
  cuda::Graph graph(Device::cuda(0), [&] {
    cuda::Event fork;
    fork.record(stream);
    fork.wait(side);  // the side stream joins the capture
    std::thread([&] { used = Tensor(); }).join();
    cuda::Event join;
    join.record(side);
    join.wait(stream);
    out = add(x, x);
  });
  graph.replay();
  const Tensor after = add(x, x);  // the allocator processes its pending frees
  stream.synchronize();
  EXPECT_TRUE(all_equal(after, 4.0f));
  EXPECT_TRUE(all_equal(out, 4.0f));
}

// Graph::capturing(device) names the Graph whose capture the device's current stream is in: the
// one of this thread, or an error saying that the stream joined the capture of another thread's
// Graph (work that registers replay hooks must be queued by the capturing thread).
TEST_F(EngineCudaRuntime, CapturingOfADeviceNamesTheThreadWhoseGraphTheStreamJoined) {
  const cuda::Stream stream = cuda::pooled_stream(0);
  const cuda::Stream side = cuda::pooled_stream(0);
  cuda::StreamGuard on(stream);
  Tensor x = full({kN}, 2.0, DType::f32, Device::cuda(0));
  stream.synchronize();
  EXPECT_EQ(cuda::Graph::capturing(0), nullptr);
  cuda::Graph* seen = nullptr;
  std::string from_other_thread, on_side_stream_elsewhere = "not run";
  cuda::Graph graph(Device::cuda(0), [&] {
    seen = cuda::Graph::capturing(0);
    cuda::Event fork;
    fork.record(stream);
    fork.wait(side);
    std::thread([&] {
      cuda::StreamGuard on_side(side);
      from_other_thread = error_of([] { cuda::Graph::capturing(0); });
      const cuda::StreamGuard idle(cuda::pooled_stream(0));
      on_side_stream_elsewhere = error_of([] { cuda::Graph::capturing(0); });
    }).join();
    cuda::Event join;
    join.record(side);
    join.wait(stream);
    mul_(x, 2.0);
  });
  EXPECT_EQ(seen, &graph);
  EXPECT_NE(from_other_thread.find("the current stream joined the capture of a cuda::Graph on "
                                   "another thread"),
            std::string::npos)
      << from_other_thread;
  EXPECT_EQ(on_side_stream_elsewhere, "") << "a stream outside the capture is not captured";
  EXPECT_EQ(cuda::Graph::capturing(0), nullptr);
}

// A free still waiting for another stream's event when a capture starts: the allocator queries
// no event during the capture (CUDA forbids it; the emulator fails the capture), and the block
// comes back after it.
TEST_F(EngineCudaRuntime, AFreeWaitingForAnotherStreamDoesNotFailACapture) {
  const cuda::Stream stream = cuda::pooled_stream(0);
  const cuda::Stream other = cuda::pooled_stream(0);
  cuda::StreamGuard on(stream);
  cuda::CachingAllocator& allocator = cuda::runtime().device_allocator(0);
  Tensor x = full({kN}, 2.0, DType::f32, Device::cuda(0));
  {
    Tensor used = full({kN}, 1.0, DType::f32, Device::cuda(0));
    other.wait(stream);
    cuda::record_stream(used, other);
  }
  EXPECT_EQ(allocator.stats().pending_free_blocks, 1);
  Tensor y;
  cuda::Graph graph(Device::cuda(0), [&] { y = add(x, x); });
  graph.replay();
  stream.synchronize();
  other.synchronize();
  EXPECT_TRUE(all_equal(y, 4.0f));
  const Tensor later = Tensor::empty({kN}, DType::f32, Device::cuda(0));  // processes the events
  EXPECT_EQ(allocator.stats().pending_free_blocks, 0);
}

// A block the graph holds (made before the capture, freed in it) goes back after the work of the
// streams the graph was replayed on: a replay on another stream than the capture's keeps it
// pending until that stream gets there.
TEST_F(EngineCudaRuntime, AHeldBlockWaitsForTheStreamsTheGraphWasReplayedOn) {
  const cuda::Stream stream = cuda::pooled_stream(0);
  const cuda::Stream other = cuda::pooled_stream(0);
  cuda::StreamGuard on(stream);
  cuda::CachingAllocator& allocator = cuda::runtime().device_allocator(0);
  Tensor x = full({kN}, 2.0, DType::f32, Device::cuda(0));
  stream.synchronize();
  auto graph = std::make_unique<cuda::Graph>(Device::cuda(0), [&] {
    mul_(x, 3.0);
    x = Tensor();  // held: the graph keeps using it
  });
  {
    cuda::StreamGuard on_other(other);
    other.wait(stream);
    graph->replay();
  }
  const int64_t pending = allocator.stats().pending_free_blocks;
  graph.reset();
  EXPECT_EQ(allocator.stats().pending_free_blocks, pending + 1)
      << "the held block waits for the replay's stream";
  other.synchronize();
  const Tensor later = Tensor::empty({kN}, DType::f32, Device::cuda(0));
  EXPECT_EQ(allocator.stats().pending_free_blocks, pending);
}

TEST_F(EngineCudaRuntime, DestroyingARuntimeReturnsAllItsMemoryToTheDevices) {
  cuda::Runtime* const process_runtime = &cuda::runtime();
  void* live = nullptr;
  void* cached = nullptr;
  void* reused = nullptr;
  void* pinned = nullptr;
  {
    cuda::Runtime local(cuda::system_backend());
    {
      cuda::ScopedRuntime use(local);
      ASSERT_EQ(&cuda::runtime(), &local);
      live = local.device_allocator(1).allocate(4096, nullptr);
      { cached = filled(int64_t(kMiB), 1.0, 1).raw_data(); }
      {
        // A block used on another stream: freed through an event, which is then recycled.
        Tensor t = filled(kN, 2.0, 1);
        const cuda::Stream other = cuda::pooled_stream(1);
        other.wait(cuda::current_stream(1));
        cuda::record_stream(t, other);
      }
      cuda::synchronize(1);
      { reused = Tensor::empty({kN}, DType::f32, Device::cuda(1)).raw_data(); }
      { pinned = Tensor::empty_pinned({kN}, DType::f32).raw_data(); }
      EXPECT_EQ(local.device_allocator(1).stats().pending_free_blocks, 0);
    }
    EXPECT_EQ(&cuda::runtime(), process_runtime) << "ScopedRuntime did not restore the runtime";
    EXPECT_EQ(emu::memory_owner(live), 1);
    EXPECT_EQ(emu::memory_owner(cached), 1);
    EXPECT_EQ(emu::memory_owner(reused), 1);
    EXPECT_EQ(emu::memory_owner(pinned), -1);
  }
  EXPECT_EQ(emu::memory_owner(live), -2) << "a block still handed out was not freed";
  EXPECT_EQ(emu::memory_owner(cached), -2);
  EXPECT_EQ(emu::memory_owner(reused), -2);
  EXPECT_EQ(emu::memory_owner(pinned), -2);
}

// ---- No device (ctest runs this with RG_EMU_DEVICES=0) ----

TEST(EngineCudaWithoutDevices, EveryEntryPointNamesTheMissingDevice) {
  if (cuda::runtime().device_count() > 0) {
    GTEST_SKIP() << "devices are visible; emu.EngineCudaWithoutDevices runs this with "
                    "RG_EMU_DEVICES=0";
  }
  const std::string why =
      "no CUDA driver or GPU is usable (cudaGetDeviceCount: no CUDA-capable device is detected)";
  EXPECT_EQ(cuda::runtime().backend().unavailable_reason(), why);
  expect_error([] { Tensor::empty({4}, DType::f32, Device::cuda(0)); },
               "no CUDA device: cannot allocate memory on cuda:0: " + why);
  expect_error([] { Tensor::empty_pinned({4}); }, "no CUDA device: cannot pin host memory: " + why);
  expect_error([] { cuda::current_stream(); }, "no CUDA device: cannot use a stream on cuda:0");
  expect_error([] { cuda::set_device(1); }, "cannot set the current device on cuda:1");
  EXPECT_NO_THROW(cuda::empty_cache()) << "nothing can be cached without a device";
  EXPECT_FALSE(dist::nccl_available());
  expect_error([] { dist::ProcessGroupNCCL pg(std::make_shared<dist::HashStore>(), 0, 1); },
               "the nccl backend needs a CUDA device and none is visible");
}

}  // namespace
}  // namespace rg
