// The CUDA runtime on the CPU: the caching and pinned allocators, devices, streams, events and
// Tensor::to(cuda) run over a fake backend (host memory, streams whose work completes when the
// test says so); and without a GPU every CUDA entry point fails with a clear rg::Error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "engine/autograd/node.h"
#include "engine/cuda/backend.h"
#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/device_guard.h"
#include "engine/cuda/event.h"
#include "engine/cuda/memory.h"
#include "engine/cuda/pinned_allocator.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/stream.h"
#include "engine/dispatch.h"
#include "engine/ops/factory.h"
#include "engine/ops/reduce.h"
#include "kernels/cuda/device.h"
#include "kernels/error.h"

namespace rg {
namespace {

using cuda::CachingAllocator;
using cuda::EventHandle;
using cuda::StreamHandle;

constexpr size_t kMiB = size_t(1) << 20;

// Host memory stands in for device memory. Every stream keeps a count of work submitted (copies,
// memsets, submit()) and of work completed, which only moves on complete()/synchronize: so a test
// decides when queued work is done. An event reached = its stream completed up to the event.
class FakeBackend final : public cuda::Backend {
 public:
  explicit FakeBackend(int devices = 1, size_t device_capacity = size_t(1) << 40)
      : devices_(devices), capacity_(device_capacity) {
    for (int d = 0; d < devices; ++d) default_streams_.push_back(std::make_unique<FakeStream>(d));
  }
  ~FakeBackend() override {
    EXPECT_TRUE(device_memory_.empty()) << device_memory_.size() << " device blocks leaked";
    EXPECT_TRUE(host_memory_.empty()) << host_memory_.size() << " pinned blocks leaked";
    EXPECT_TRUE(events_.empty()) << events_.size() << " events leaked";
  }

  struct FakeStream {
    explicit FakeStream(int d) : device(d) {}
    int device;
    uint64_t submitted = 0;
    uint64_t completed = 0;
  };
  struct FakeEvent {
    int device;
    bool timing;
    FakeStream* stream = nullptr;
    uint64_t tick = 0;
  };
  struct Wait {
    FakeStream* waiting;
    FakeStream* on;
    uint64_t tick;
  };

  // Test controls.
  FakeStream* stream(int device, StreamHandle h) {
    return h == nullptr ? default_streams_[size_t(device)].get() : static_cast<FakeStream*>(h);
  }
  void submit(const cuda::Stream& s) { ++stream(s.device_index(), s.handle())->submitted; }
  void complete(const cuda::Stream& s) {
    FakeStream* st = stream(s.device_index(), s.handle());
    st->completed = st->submitted;
  }
  bool idle(const cuda::Stream& s) {
    FakeStream* st = stream(s.device_index(), s.handle());
    return st->completed == st->submitted;
  }
  size_t device_bytes() const {
    size_t n = 0;
    for (const auto& [p, size] : device_memory_) n += size;
    return n;
  }

  int device_mallocs = 0, device_frees = 0, host_mallocs = 0, host_frees = 0;
  int events_created = 0, streams_created = 0, set_device_calls = 0;
  std::vector<Wait> waits;
  // Faults to inject: record_event and stream_capturing throw while these are set.
  bool fail_record_event = false, fail_capture_query = false;

  // Backend.
  int device_count() override { return devices_; }
  std::string unavailable_reason() override { return "the fake backend has no devices"; }
  int current_device() override { return current_; }
  void set_device(int device) override {
    RG_CHECK(device >= 0 && device < devices_, "fake set_device(", device, ")");
    ++set_device_calls;
    current_ = device;
  }
  void synchronize_device(int device) override {
    std::lock_guard<std::mutex> lock(mu_);
    default_streams_[size_t(device)]->completed = default_streams_[size_t(device)]->submitted;
    for (auto& s : streams_) {
      if (s->device == device) s->completed = s->submitted;
    }
  }
  void* malloc_device(int device, size_t nbytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_TRUE(device >= 0 && device < devices_);
    if (used_[device] + nbytes > capacity_) return nullptr;
    void* p = std::aligned_alloc(512, (nbytes + 511) / 512 * 512);
    device_memory_[p] = nbytes;
    used_[device] += nbytes;
    owner_[p] = device;
    ++device_mallocs;
    return p;
  }
  void free_device(int device, void* ptr) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = device_memory_.find(ptr);
    RG_CHECK(it != device_memory_.end(), "fake free_device of unknown ", ptr);
    EXPECT_EQ(owner_[ptr], device);
    used_[device] -= it->second;
    device_memory_.erase(it);
    std::free(ptr);
    ++device_frees;
  }
  void* malloc_host(size_t nbytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    void* p = std::aligned_alloc(4096, nbytes);
    host_memory_.insert(p);
    ++host_mallocs;
    return p;
  }
  void free_host(void* ptr) override {
    std::lock_guard<std::mutex> lock(mu_);
    RG_CHECK(host_memory_.erase(ptr) == 1, "fake free_host of unknown ", ptr);
    std::free(ptr);
    ++host_frees;
  }
  void copy_async(void* dst, const void* src, size_t nbytes, int device, StreamHandle s) override {
    std::memcpy(dst, src, nbytes);
    ++stream(device, s)->submitted;
  }
  void memset_async(void* dst, int byte, size_t nbytes, int device, StreamHandle s) override {
    std::memset(dst, byte, nbytes);
    ++stream(device, s)->submitted;
  }
  StreamHandle create_stream(int device) override {
    streams_.push_back(std::make_unique<FakeStream>(device));
    ++streams_created;
    return streams_.back().get();
  }
  bool query_stream(int device, StreamHandle s) override {
    return stream(device, s)->completed == stream(device, s)->submitted;
  }
  void synchronize_stream(int device, StreamHandle s) override {
    stream(device, s)->completed = stream(device, s)->submitted;
  }
  EventHandle create_event(int device, bool timing) override {
    auto* e = new FakeEvent{device, timing};
    events_.insert(e);
    ++events_created;
    return e;
  }
  void destroy_event(int device, EventHandle e) override {
    auto* fe = static_cast<FakeEvent*>(e);
    RG_CHECK(events_.erase(fe) == 1, "fake destroy_event of unknown event");
    EXPECT_EQ(fe->device, device);
    delete fe;
  }
  void record_event(int device, EventHandle e, StreamHandle s) override {
    RG_CHECK(!fail_record_event, "fake record_event failure");
    auto* fe = static_cast<FakeEvent*>(e);
    EXPECT_EQ(fe->device, device);
    fe->stream = stream(device, s);
    fe->tick = fe->stream->submitted;
  }
  bool stream_capturing(int, StreamHandle) override {
    RG_CHECK(!fail_capture_query, "fake stream_capturing failure");
    return false;
  }
  void wait_event(int device, StreamHandle s, EventHandle e) override {
    auto* fe = static_cast<FakeEvent*>(e);
    waits.push_back({stream(device, s), fe->stream, fe->tick});
  }
  bool query_event(int, EventHandle e) override {
    auto* fe = static_cast<FakeEvent*>(e);
    return fe->stream == nullptr || fe->stream->completed >= fe->tick;
  }
  void synchronize_event(int, EventHandle e) override {
    auto* fe = static_cast<FakeEvent*>(e);
    if (fe->stream != nullptr && fe->stream->completed < fe->tick) fe->stream->completed = fe->tick;
  }
  // One millisecond per unit of work between the two events.
  float elapsed_ms(int, EventHandle start, EventHandle end) override {
    return float(static_cast<FakeEvent*>(end)->tick - static_cast<FakeEvent*>(start)->tick);
  }

 private:
  int devices_;
  size_t capacity_;
  int current_ = 0;
  std::mutex mu_;
  std::map<int, size_t> used_;
  std::map<void*, size_t> device_memory_;
  std::map<void*, int> owner_;
  std::set<void*> host_memory_;
  std::set<FakeEvent*> events_;
  std::vector<std::unique_ptr<FakeStream>> default_streams_;
  std::vector<std::unique_ptr<FakeStream>> streams_;
};

// Distinct fake stream handles for allocator tests that do not need a runtime.
StreamHandle fake_stream(FakeBackend& fake) { return fake.create_stream(0); }

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- the caching allocator --------------------------------------------------------------------

TEST(CudaCachingAllocator, ReusesAFreedBlockWithoutDeviceCalls) {
  FakeBackend fake;
  {
    CachingAllocator a(fake, 0);
    void* p = a.allocate(1000, nullptr);
    a.deallocate(p);
    void* q = a.allocate(1000, nullptr);
    EXPECT_EQ(p, q);
    a.deallocate(q);
    EXPECT_EQ(fake.device_mallocs, 1);
    EXPECT_EQ(fake.device_frees, 0);
    EXPECT_EQ(a.stats().num_allocs, 2);
  }
  EXPECT_EQ(fake.device_frees, 1);  // the destructor returns everything
}

TEST(CudaCachingAllocator, SteadyStateTrainingLoopNeverCallsTheDevice) {
  FakeBackend fake;
  CachingAllocator a(fake, 0);
  // A "step": activations of mixed sizes allocated in order, freed in reverse (backward), plus a
  // few short-lived temporaries.
  const std::vector<size_t> sizes = {4,        3072,      204800, kMiB,   kMiB + 1,
                                     5 * kMiB, 12 * kMiB, 64,     100000, 7 * kMiB};
  auto step = [&] {
    std::vector<void*> live;
    for (size_t s : sizes) {
      live.push_back(a.allocate(s, nullptr));
      a.deallocate(a.allocate(s / 2 + 1, nullptr));
    }
    while (!live.empty()) {
      a.deallocate(live.back());
      live.pop_back();
    }
  };
  step();
  const cuda::DeviceMemoryStats warm = a.stats();
  for (int i = 0; i < 50; ++i) step();
  const cuda::DeviceMemoryStats after = a.stats();
  EXPECT_EQ(after.num_device_allocs, warm.num_device_allocs);
  EXPECT_EQ(after.num_device_frees, 0);
  EXPECT_EQ(after.reserved_bytes, warm.reserved_bytes);
  EXPECT_EQ(after.allocated_bytes, 0);
  EXPECT_EQ(after.num_allocs, 51 * int64_t(2 * sizes.size()));
}

TEST(CudaCachingAllocator, RoundsTo512BytesAndPacksSmallBlocksIntoOneSegment) {
  FakeBackend fake;
  CachingAllocator a(fake, 0);
  void* p1 = a.allocate(1, nullptr);
  EXPECT_EQ(a.block_size(p1), 512u);
  void* p2 = a.allocate(513, nullptr);
  EXPECT_EQ(a.block_size(p2), 1024u);
  void* p3 = a.allocate(kMiB, nullptr);  // the largest small request
  EXPECT_EQ(a.block_size(p3), kMiB);
  EXPECT_EQ(fake.device_mallocs, 1);  // one 2 MiB segment holds all three
  EXPECT_EQ(static_cast<char*>(p2) - static_cast<char*>(p1), 512);
  const cuda::DeviceMemoryStats s = a.stats();
  EXPECT_EQ(s.reserved_bytes, int64_t(CachingAllocator::kSmallSegment));
  EXPECT_EQ(s.allocated_bytes, int64_t(512 + 1024 + kMiB));
  EXPECT_EQ(s.requested_bytes, int64_t(1 + 513 + kMiB));
  for (void* p : {p1, p2, p3}) a.deallocate(p);
}

TEST(CudaCachingAllocator, LargeRequestsComeFromLargeSegments) {
  FakeBackend fake;
  CachingAllocator a(fake, 0);
  void* mid = a.allocate(kMiB + 1, nullptr);  // 1 MiB < size < 10 MiB: a 20 MiB segment
  EXPECT_EQ(a.stats().reserved_bytes, int64_t(20 * kMiB));
  void* mid2 = a.allocate(3 * kMiB, nullptr);  // carved from the same segment
  EXPECT_EQ(fake.device_mallocs, 1);
  void* fits = a.allocate(11 * kMiB, nullptr);  // >= 10 MiB, but fits in the 16 MiB left over
  EXPECT_EQ(fake.device_mallocs, 1);
  void* big = a.allocate(17 * kMiB + 5, nullptr);  // own segment, rounded up to 2 MiB
  EXPECT_EQ(fake.device_mallocs, 2);
  EXPECT_EQ(a.stats().reserved_bytes, int64_t(38 * kMiB));
  // The 1 MiB - 512 left over is too small to split off as a large block: it stays with `big`.
  EXPECT_EQ(a.block_size(big), 18 * kMiB);
  void* small = a.allocate(100, nullptr);  // small requests never come from large segments
  EXPECT_EQ(fake.device_mallocs, 3);
  for (void* p : {mid, mid2, fits, big, small}) a.deallocate(p);
}

TEST(CudaCachingAllocator, SplitsBlocksAndMergesFreedNeighbours) {
  FakeBackend fake;
  CachingAllocator a(fake, 0);
  void* x = a.allocate(4096, nullptr);
  void* y = a.allocate(4096, nullptr);
  void* z = a.allocate(4096, nullptr);
  a.deallocate(x);
  a.deallocate(y);
  // x and y merged: an 8 KiB request fits exactly where x was.
  void* xy = a.allocate(8192, nullptr);
  EXPECT_EQ(xy, x);
  a.deallocate(xy);
  a.deallocate(z);
  // Everything merged back into one free 2 MiB segment, which empty_cache returns.
  a.empty_cache();
  EXPECT_EQ(fake.device_frees, 1);
  EXPECT_EQ(a.stats().reserved_bytes, 0);
}

TEST(CudaCachingAllocator, FreeBlocksBelongToTheirStream) {
  FakeBackend fake;
  CachingAllocator a(fake, 0);
  StreamHandle s1 = fake_stream(fake);
  StreamHandle s2 = fake_stream(fake);
  void* p = a.allocate(kMiB, s1);
  a.deallocate(p);
  // The free block is in s1's pool: s2 cannot have it, s1 gets it back.
  void* q = a.allocate(kMiB, s2);
  EXPECT_NE(q, p);
  EXPECT_EQ(fake.device_mallocs, 2);
  void* r = a.allocate(kMiB, s1);
  EXPECT_EQ(r, p);
  a.deallocate(q);
  a.deallocate(r);
}

TEST(CudaCachingAllocator, TracksPeakAndResetsIt) {
  FakeBackend fake;
  CachingAllocator a(fake, 0);
  void* p = a.allocate(3 * kMiB, nullptr);
  void* q = a.allocate(2048, nullptr);
  EXPECT_EQ(a.stats().peak_allocated_bytes, int64_t(3 * kMiB + 2048));
  a.deallocate(p);
  cuda::DeviceMemoryStats s = a.stats();
  EXPECT_EQ(s.allocated_bytes, 2048);
  EXPECT_EQ(s.peak_allocated_bytes, int64_t(3 * kMiB + 2048));
  EXPECT_EQ(s.peak_reserved_bytes, int64_t(22 * kMiB));
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().peak_allocated_bytes, 2048);
  a.deallocate(q);
  EXPECT_EQ(a.stats().peak_allocated_bytes, 2048);
}

TEST(CudaCachingAllocator, EmptyCacheReturnsOnlyUnusedSegments) {
  FakeBackend fake;
  CachingAllocator a(fake, 0);
  void* live = a.allocate(1000, nullptr);   // keeps its 2 MiB segment in use
  void* freed = a.allocate(1000, nullptr);  // same segment
  void* big = a.allocate(30 * kMiB, nullptr);
  a.deallocate(freed);
  a.deallocate(big);
  a.empty_cache();
  EXPECT_EQ(fake.device_frees, 1);  // the 30 MiB segment
  EXPECT_EQ(a.stats().reserved_bytes, int64_t(CachingAllocator::kSmallSegment));
  EXPECT_EQ(a.stats().num_device_frees, 1);
  a.deallocate(live);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 0);
  EXPECT_EQ(fake.device_bytes(), 0u);
}

TEST(CudaCachingAllocator, BlockUsedOnAnotherStreamIsReusedOnlyAfterThatStreamsWork) {
  FakeBackend fake;
  CachingAllocator a(fake, 0);
  const cuda::Stream main(0, fake_stream(fake));
  const cuda::Stream side(0, fake_stream(fake));
  void* p = a.allocate(4096, main.handle());
  a.record_stream(p, side.handle());
  fake.submit(side);  // the side stream has queued work that reads p
  a.deallocate(p);
  EXPECT_EQ(a.stats().allocated_bytes, 0);
  EXPECT_EQ(a.stats().pending_free_blocks, 1);
  void* q = a.allocate(4096, main.handle());
  EXPECT_NE(q, p) << "reused while the side stream may still read it";
  fake.complete(side);
  void* r = a.allocate(4096, main.handle());
  EXPECT_EQ(r, p);
  EXPECT_EQ(a.stats().pending_free_blocks, 0);
  a.deallocate(q);
  a.deallocate(r);
}

TEST(CudaCachingAllocator, CrossStreamFreesRecycleTheirEvents) {
  FakeBackend fake;
  CachingAllocator a(fake, 0);
  const cuda::Stream side(0, fake_stream(fake));
  for (int i = 0; i < 20; ++i) {
    void* p = a.allocate(4096, nullptr);
    a.record_stream(p, side.handle());
    a.record_stream(p, side.handle());  // recorded once
    a.record_stream(p, nullptr);        // its own stream: nothing to wait for
    a.deallocate(p);
    fake.complete(side);
  }
  EXPECT_EQ(fake.events_created, 1);
}

TEST(CudaCachingAllocator, EmptyCacheWaitsForPendingBlocks) {
  FakeBackend fake;
  CachingAllocator a(fake, 0);
  const cuda::Stream side(0, fake_stream(fake));
  void* p = a.allocate(12 * kMiB, nullptr);
  a.record_stream(p, side.handle());
  fake.submit(side);
  a.deallocate(p);
  a.empty_cache();  // synchronizes the event, then returns the segment
  EXPECT_TRUE(fake.idle(side));
  EXPECT_EQ(a.stats().reserved_bytes, 0);
  EXPECT_EQ(fake.device_frees, 1);
}

TEST(CudaCachingAllocator, OutOfMemoryReleasesTheCacheAndRetries) {
  FakeBackend fake(1, 40 * kMiB);
  CachingAllocator a(fake, 0);
  StreamHandle s1 = fake_stream(fake);
  StreamHandle s2 = fake_stream(fake);
  a.deallocate(a.allocate(30 * kMiB, s1));  // cached in s1's pool
  void* p = a.allocate(30 * kMiB, s2);      // does not fit next to it: flush and retry
  EXPECT_NE(p, nullptr);
  const cuda::DeviceMemoryStats s = a.stats();
  EXPECT_EQ(s.num_cache_flushes, 1);
  EXPECT_EQ(s.num_device_frees, 1);
  EXPECT_EQ(s.reserved_bytes, int64_t(30 * kMiB));
  a.deallocate(p);
}

TEST(CudaCachingAllocator, OutOfMemorySaysWhatWasAskedAndWhatIsHeld) {
  FakeBackend fake(1, 40 * kMiB);
  CachingAllocator a(fake, 0);
  void* p = a.allocate(30 * kMiB, nullptr);
  const std::string msg = error_of([&] { a.allocate(20 * kMiB, nullptr); });
  EXPECT_TRUE(contains(msg, "CUDA out of memory on cuda:0")) << msg;
  EXPECT_TRUE(contains(msg, "tried to allocate 20.00 MiB")) << msg;
  EXPECT_TRUE(contains(msg, "30.00 MiB allocated")) << msg;
  a.deallocate(p);
  EXPECT_EQ(a.stats().allocated_bytes, 0);
}

TEST(CudaCachingAllocator, ZeroBytesAndBadFrees) {
  FakeBackend fake;
  CachingAllocator a(fake, 0);
  EXPECT_EQ(a.allocate(0, nullptr), nullptr);
  a.deallocate(nullptr);
  EXPECT_EQ(fake.device_mallocs, 0);
  void* p = a.allocate(100, nullptr);
  EXPECT_TRUE(contains(error_of([&] { a.deallocate(static_cast<char*>(p) + 8); }),
                       "which it did not hand out"));
  a.deallocate(p);
  EXPECT_TRUE(contains(error_of([&] { a.deallocate(p); }), "freed already"));
  EXPECT_TRUE(
      contains(error_of([&] { a.allocate(size_t(1) << 60, nullptr); }), "impossibly large"));
}

TEST(CudaCachingAllocator, ThreadsAllocatingTogetherKeepTheStatsRight) {
  FakeBackend fake;
  CachingAllocator a(fake, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&a, t] {
      std::vector<void*> live;
      for (int i = 0; i < 500; ++i) {
        live.push_back(a.allocate(size_t(512 * (1 + (i * 7 + t) % 40)), nullptr));
        if (live.size() > 8) {
          a.deallocate(live.front());
          live.erase(live.begin());
        }
      }
      for (void* p : live) a.deallocate(p);
    });
  }
  for (auto& th : threads) th.join();
  const cuda::DeviceMemoryStats s = a.stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.requested_bytes, 0);
  EXPECT_EQ(s.num_allocs, 2000);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 0);
  EXPECT_EQ(fake.device_bytes(), 0u);
}

// ---- the pinned allocator ---------------------------------------------------------------------

TEST(CudaPinnedAllocator, SizeClassesArePagesThenEightPerPowerOfTwo) {
  using cuda::PinnedAllocator;
  EXPECT_EQ(PinnedAllocator::size_class(1), 4096u);
  EXPECT_EQ(PinnedAllocator::size_class(4097), 8192u);
  EXPECT_EQ(PinnedAllocator::size_class(32768), 32768u);
  EXPECT_EQ(PinnedAllocator::size_class(kMiB + 1), kMiB + kMiB / 8);
  EXPECT_EQ(PinnedAllocator::size_class(100 * kMiB), 104 * kMiB);  // 96 + 8
}

TEST(CudaPinnedAllocator, ReusesCachedBlocksAndCountsThem) {
  FakeBackend fake;
  cuda::PinnedAllocator a(fake);
  void* p = a.allocate(10000);
  a.deallocate(p);
  void* q = a.allocate(9000);  // same class
  EXPECT_EQ(p, q);
  EXPECT_EQ(fake.host_mallocs, 1);
  cuda::HostMemoryStats s = a.stats();
  EXPECT_EQ(s.allocated_bytes, 12288);
  EXPECT_EQ(s.reserved_bytes, 12288);
  void* r = a.allocate(1);
  EXPECT_EQ(a.stats().peak_allocated_bytes, 12288 + 4096);
  a.deallocate(q);
  a.deallocate(r);
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().peak_allocated_bytes, 0);
  a.empty_cache();
  EXPECT_EQ(fake.host_frees, 2);
  EXPECT_EQ(a.stats().reserved_bytes, 0);
  EXPECT_TRUE(contains(error_of([&] { a.deallocate(p); }), "did not hand out"));
}

TEST(CudaPinnedAllocator, BlockReadByAQueuedCopyIsReusedOnlyAfterIt) {
  FakeBackend fake(2);
  cuda::PinnedAllocator a(fake);
  const cuda::Stream copy_stream(1, fake_stream(fake));
  void* p = a.allocate(5000);
  a.record_stream(p, 1, copy_stream.handle());
  fake.submit(copy_stream);
  a.deallocate(p);
  EXPECT_EQ(a.stats().pending_free_blocks, 1);
  void* q = a.allocate(5000);
  EXPECT_NE(q, p);
  fake.complete(copy_stream);
  void* r = a.allocate(5000);
  EXPECT_EQ(r, p);
  a.deallocate(q);
  a.deallocate(r);
}

// A free that cannot record its event (or ask whether the stream is captured) throws and keeps
// the block; later allocations do not fail for it and free it once the backend works again;
// empty_cache reports the error while it lasts.
TEST(CudaPinnedAllocator, AFreeThatCannotRecordItsEventKeepsTheBlockAndFailsNothingElse) {
  FakeBackend fake;
  cuda::PinnedAllocator a(fake);
  const cuda::Stream copy_stream(0, fake_stream(fake));
  void* p = a.allocate(5000);
  void* q = a.allocate(5000);
  a.record_stream(p, 0, copy_stream.handle());
  a.record_stream(q, 0, copy_stream.handle());
  fake.submit(copy_stream);
  fake.fail_record_event = true;
  EXPECT_TRUE(contains(error_of([&] { a.deallocate(p); }), "fake record_event failure"));
  fake.fail_record_event = false;
  fake.fail_capture_query = true;
  EXPECT_TRUE(contains(error_of([&] { a.deallocate(q); }), "fake stream_capturing failure"));
  EXPECT_EQ(a.stats().pending_free_blocks, 2);
  fake.fail_record_event = true;
  void* r = a.allocate(5000);  // the two stay held, and this allocation does not fail for them
  EXPECT_NE(r, p);
  EXPECT_NE(r, q);
  EXPECT_EQ(a.stats().pending_free_blocks, 2);
  EXPECT_TRUE(contains(error_of([&] { a.empty_cache(); }), "fake"));
  fake.fail_record_event = false;
  fake.fail_capture_query = false;
  void* s = a.allocate(5000);  // their events are recorded now; the copy is still queued
  EXPECT_TRUE(s != p && s != q);
  EXPECT_EQ(a.stats().pending_free_blocks, 2);
  fake.complete(copy_stream);
  const std::set<void*> again{a.allocate(5000), a.allocate(5000)};
  EXPECT_EQ(again, (std::set<void*>{p, q}));
  EXPECT_EQ(a.stats().pending_free_blocks, 0);
  for (void* b : {r, s, p, q}) a.deallocate(b);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 0);
}

// ---- devices, streams and events through the runtime ------------------------------------------

// A runtime over a fake backend, made the process's runtime for the test.
struct FakeRuntime {
  explicit FakeRuntime(int devices = 1) : fake(devices), rt(fake), use(rt) {}
  FakeBackend fake;
  cuda::Runtime rt;
  cuda::ScopedRuntime use;
};

TEST(CudaRuntime, DeviceGuardSetsAndRestoresTheDevice) {
  FakeRuntime f(2);
  EXPECT_EQ(cuda::current_device(), 0);
  {
    cuda::DeviceGuard g(1);
    EXPECT_EQ(cuda::current_device(), 1);
    EXPECT_EQ(g.original_device(), 0);
    {
      cuda::DeviceGuard inner(Device::cuda(0));
      EXPECT_EQ(cuda::current_device(), 0);
    }
    EXPECT_EQ(cuda::current_device(), 1);
  }
  EXPECT_EQ(cuda::current_device(), 0);
  const int calls = f.fake.set_device_calls;
  {
    cuda::DeviceGuard same(0);
    cuda::DeviceGuard cpu(Device::cpu());
  }
  EXPECT_EQ(f.fake.set_device_calls, calls);  // nothing to change
  const std::string msg = error_of([] { cuda::DeviceGuard g(2); });
  EXPECT_TRUE(contains(msg, "cuda:2: that device does not exist (2 CUDA devices visible)")) << msg;
}

TEST(CudaRuntime, CurrentStreamIsTheDefaultStreamUntilSetAndIsPerThread) {
  FakeRuntime f(2);
  EXPECT_TRUE(cuda::current_stream().is_default());
  EXPECT_EQ(cuda::current_stream(1), cuda::default_stream(1));
  const cuda::Stream s = cuda::pooled_stream(1);
  EXPECT_FALSE(s.is_default());
  EXPECT_EQ(s.device_index(), 1);
  {
    cuda::StreamGuard g(s);
    EXPECT_EQ(cuda::current_stream(1), s);
    EXPECT_EQ(cuda::current_device(), 1);  // the guard also moves the device
    EXPECT_TRUE(cuda::current_stream(0).is_default());
    cuda::Stream seen(0, nullptr);
    std::thread([&] { seen = cuda::current_stream(1); }).join();
    EXPECT_TRUE(seen.is_default());  // another thread keeps its own current stream
  }
  EXPECT_TRUE(cuda::current_stream(1).is_default());
  EXPECT_EQ(cuda::current_device(), 0);
  cuda::set_current_stream(s);
  EXPECT_EQ(cuda::current_stream(1), s);
  cuda::set_current_stream(cuda::default_stream(1));
  EXPECT_EQ(cuda::default_stream(1).str(), "cuda:1/default");
}

TEST(CudaRuntime, PooledStreamsAreCreatedOnceAndHandedOutRoundRobin) {
  FakeRuntime f;
  std::set<StreamHandle> seen;
  for (int i = 0; i < cuda::Runtime::kStreamPoolSize; ++i)
    seen.insert(cuda::pooled_stream(0).handle());
  EXPECT_EQ(seen.size(), size_t(cuda::Runtime::kStreamPoolSize));
  EXPECT_EQ(seen.count(nullptr), 0u);
  const StreamHandle again = cuda::pooled_stream(0).handle();
  EXPECT_EQ(seen.count(again), 1u);
  EXPECT_EQ(f.fake.streams_created, cuda::Runtime::kStreamPoolSize);
}

TEST(CudaRuntime, EventsRecordQuerySynchronizeAndTime) {
  FakeRuntime f;
  const cuda::Stream s = cuda::pooled_stream(0);
  cuda::Event never;
  EXPECT_TRUE(never.query());
  never.synchronize();
  never.wait(s);  // no-op
  EXPECT_TRUE(f.fake.waits.empty());

  cuda::Event start(/*enable_timing=*/true), end(/*enable_timing=*/true);
  start.record(s);
  for (int i = 0; i < 3; ++i) f.fake.submit(s);
  end.record(s);
  EXPECT_TRUE(start.query());
  EXPECT_FALSE(end.query());
  end.synchronize();
  EXPECT_TRUE(end.query());
  EXPECT_TRUE(f.fake.idle(s));
  EXPECT_FLOAT_EQ(start.elapsed_ms(end), 3.0f);

  cuda::Event plain;
  plain.record();  // the current stream: the default stream of cuda:0
  EXPECT_TRUE(contains(error_of([&] { (void)plain.elapsed_ms(end); }), "enable_timing"));
  cuda::Event unrecorded(true);
  EXPECT_TRUE(contains(error_of([&] { (void)start.elapsed_ms(unrecorded); }), "recorded"));

  // Another stream waits for the event without blocking the host.
  f.fake.submit(s);
  end.record(s);
  const cuda::Stream other = cuda::pooled_stream(0);
  other.wait(end);
  ASSERT_EQ(f.fake.waits.size(), 1u);
  EXPECT_EQ(f.fake.waits[0].waiting, f.fake.stream(0, other.handle()));
  EXPECT_EQ(f.fake.waits[0].on, f.fake.stream(0, s.handle()));
  EXPECT_FALSE(f.fake.idle(s));

  cuda::Event moved = std::move(end);
  // A moved-from event is empty (and destroys nothing).
  EXPECT_FALSE(end.recorded());  // NOLINT(bugprone-use-after-move,clang-analyzer-cplusplus.Move)
  EXPECT_TRUE(moved.recorded());
}

TEST(CudaRuntime, EventBelongsToTheDeviceItWasFirstRecordedOn) {
  FakeRuntime f(2);
  cuda::Event e;
  e.record(cuda::default_stream(0));
  EXPECT_EQ(e.device_index(), 0);
  EXPECT_TRUE(contains(error_of([&] { e.record(cuda::default_stream(1)); }), "belongs to cuda:0"));
}

TEST(CudaRuntime, MemoryStatsFollowTensors) {
  FakeRuntime f;
  cuda::reset_peak_memory_stats(0);
  {
    Tensor t = Tensor::empty({1000}, DType::f32, Device::cuda(0));
    EXPECT_EQ(cuda::memory_stats(0).allocated_bytes, 4096);
    EXPECT_EQ(cuda::memory_stats().requested_bytes, 4000);
  }
  EXPECT_EQ(cuda::memory_stats(0).allocated_bytes, 0);
  EXPECT_EQ(cuda::memory_stats(0).peak_allocated_bytes, 4096);
  EXPECT_EQ(cuda::memory_stats(0).reserved_bytes, int64_t(CachingAllocator::kSmallSegment));
  cuda::empty_cache();
  EXPECT_EQ(cuda::memory_stats(0).reserved_bytes, 0);
}

// ---- tensors on the fake device ---------------------------------------------------------------

TEST(CudaTensor, EmptyAllocatesForTheCurrentStream) {
  FakeRuntime f;
  const cuda::Stream s = cuda::pooled_stream(0);
  void* on_default = nullptr;
  {
    Tensor a = Tensor::empty({256}, DType::f32, Device::cuda(0));
    EXPECT_EQ(a.device(), Device::cuda(0));
    EXPECT_FALSE(a.is_pinned());
    on_default = a.raw_data();
  }
  cuda::StreamGuard g(s);
  Tensor b = Tensor::empty({256}, DType::f32, Device::cuda(0));
  EXPECT_NE(b.raw_data(), on_default);  // the freed block belongs to the default stream's pool
  Tensor c = Tensor::empty({0}, DType::f32, Device::cuda(0));
  EXPECT_EQ(c.numel(), 0);
}

TEST(CudaTensor, SteadyStateTensorsNeedNoDeviceCalls) {
  FakeRuntime f;
  const std::vector<int64_t> sizes = {1, 1000, 65536, 262145, 3 << 20, 5 << 20, 7};
  auto step = [&] {
    std::vector<Tensor> live;
    for (int64_t n : sizes) {
      live.push_back(Tensor::empty({n}, DType::f32, Device::cuda(0)));
      (void)Tensor::empty({n / 2 + 1}, DType::f16, Device::cuda(0));  // a temporary
    }
  };
  step();
  const int mallocs = f.fake.device_mallocs;
  const cuda::DeviceMemoryStats warm = cuda::memory_stats(0);
  for (int i = 0; i < 20; ++i) step();
  EXPECT_EQ(f.fake.device_mallocs, mallocs);
  EXPECT_EQ(f.fake.device_frees, 0);
  EXPECT_EQ(cuda::memory_stats(0).reserved_bytes, warm.reserved_bytes);
  EXPECT_EQ(cuda::memory_stats(0).num_allocs, 21 * 14);
}

TEST(CudaTensor, RoundTripOfEveryDType) {
  FakeRuntime f;
  for (DType dt :
       {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor host = from_vector<double>({0, 1, 2, 3.5, 100, 7, 1, 2, 3, 4, 5, 6}, {3, 4}, dt);
    const Tensor dev = host.to(Device::cuda(0));
    EXPECT_EQ(dev.device(), Device::cuda(0));
    EXPECT_EQ(dev.dtype(), dt);
    EXPECT_EQ(dev.shape(), host.shape());
    EXPECT_EQ(std::memcmp(dev.raw_data(), host.raw_data(), host.nbytes()), 0);
    const Tensor back = dev.to(Device::cpu());
    EXPECT_EQ(back.device(), Device::cpu());
    EXPECT_EQ(back.to_vector<double>(), host.to_vector<double>());
    EXPECT_EQ(dev.to_vector<double>(), host.to_vector<double>());  // through the CPU
    // A view with an offset copies only its elements.
    EXPECT_EQ(dev.narrow(0, 1, 2).to(Device::cpu()).to_vector<double>(),
              host.narrow(0, 1, 2).to_vector<double>());
  }
  EXPECT_EQ(cuda::memory_stats(0).allocated_bytes, 0);
}

TEST(CudaTensor, BlockingCopiesAreDoneWhenTheyReturn) {
  FakeRuntime f;
  const Tensor host = from_vector<float>({1, 2, 3}, {3});
  const Tensor dev = host.to(Device::cuda(0));
  EXPECT_TRUE(f.fake.idle(cuda::current_stream(0)));
  f.fake.submit(cuda::current_stream(0));  // e.g. a kernel writing dev
  const Tensor back = dev.to(Device::cpu());
  EXPECT_TRUE(f.fake.idle(cuda::current_stream(0)));  // waited for the kernel and the copy
  EXPECT_EQ(back.to_vector<float>(), host.to_vector<float>());
}

TEST(CudaTensor, ConvertsDTypesOnTheHostSide) {
  FakeRuntime f;
  const Tensor host = from_vector<float>({1.5f, -2.f, 1e3f}, {3});
  Tensor dev = Tensor::empty({3}, DType::f64, Device::cuda(0));
  dev.copy_(host);  // f32 -> f64 on the way up
  EXPECT_EQ(dev.to_vector<double>(), (std::vector<double>{1.5, -2, 1000}));
  Tensor half = Tensor::empty({3}, DType::f16);
  half.copy_(dev);  // f64 -> f16 on the way down
  EXPECT_EQ(half.to_vector<float>(), (std::vector<float>{1.5f, -2.f, 1000.f}));
  // Conversions on the device run the cast kernel: tests/device checks every dtype pair there.
}

TEST(CudaTensor, ZeroFillsAndReadsBack) {
  FakeRuntime f;
  Tensor z = zeros({5}, DType::bf16, Device::cuda(0));
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(5, 0.f));
  Tensor one = from_vector<int32_t>({42}, {1}).to(Device::cuda(0));
  EXPECT_EQ(one.item<int>(), 42);
  EXPECT_TRUE(contains(one.str(), "device=cuda:0")) << one.str();
  const uint64_t v = z.storage()->version();
  z.zero_();
  EXPECT_EQ(z.storage()->version(), v + 1);
}

TEST(CudaTensor, CopyBetweenDevicesIsOrderedWithBothStreams) {
  FakeRuntime f(2);
  const Tensor host = from_vector<float>({1, 2, 3, 4}, {4});
  const Tensor on0 = host.to(Device::cuda(0));
  const Tensor on1 = on0.to(Device::cuda(1));
  EXPECT_EQ(on1.device(), Device::cuda(1));
  EXPECT_EQ(on1.to_vector<float>(), host.to_vector<float>());
  // cuda:1's stream waited for cuda:0's, then cuda:0's for the copy.
  ASSERT_EQ(f.fake.waits.size(), 2u);
  EXPECT_EQ(f.fake.waits[0].waiting, f.fake.stream(1, nullptr));
  EXPECT_EQ(f.fake.waits[0].on, f.fake.stream(0, nullptr));
  EXPECT_EQ(f.fake.waits[1].waiting, f.fake.stream(0, nullptr));
  EXPECT_EQ(f.fake.waits[1].on, f.fake.stream(1, nullptr));
  // Same device: a plain copy on the current stream.
  const Tensor again = on1.clone();
  EXPECT_EQ(again.to_vector<float>(), host.to_vector<float>());
  EXPECT_EQ(f.fake.waits.size(), 2u);
}

TEST(CudaTensor, PinnedNonBlockingCopiesKeepTheHostBlockUntilDone) {
  FakeRuntime f;
  const Tensor host = from_vector<float>({1, 2, 3, 4}, {4});
  Tensor pinned = host.pin_memory();
  EXPECT_TRUE(pinned.is_pinned());
  EXPECT_FALSE(host.is_pinned());
  EXPECT_TRUE(pinned.pin_memory().is_same(pinned));
  EXPECT_EQ(cuda::pinned_memory_stats().allocated_bytes, 4096);
  void* block = pinned.raw_data();
  const cuda::Stream s = cuda::current_stream(0);

  const Tensor dev = pinned.to(Device::cuda(0), /*non_blocking=*/true);
  EXPECT_FALSE(f.fake.idle(s));  // queued, not waited for
  pinned = Tensor();             // freed while the copy may still read it
  EXPECT_EQ(cuda::pinned_memory_stats().pending_free_blocks, 1);
  Tensor next = Tensor::empty_pinned({4});
  EXPECT_NE(next.raw_data(), block);
  s.synchronize();
  Tensor after = Tensor::empty_pinned({4});
  EXPECT_EQ(after.raw_data(), block);

  // Device to pinned host without blocking, then wait with an event.
  Tensor out = Tensor::empty_pinned({4});
  out.copy_(dev, /*non_blocking=*/true);
  cuda::Event done;
  done.record(s);
  done.synchronize();
  EXPECT_EQ(out.to_vector<float>(), host.to_vector<float>());
  // A pageable destination is always complete on return.
  f.fake.submit(s);
  Tensor pageable = Tensor::empty({4});
  pageable.copy_(dev, /*non_blocking=*/true);
  EXPECT_EQ(pageable.to_vector<float>(), host.to_vector<float>());
  EXPECT_TRUE(contains(error_of([&] { (void)dev.pin_memory(); }), "only CPU tensors"));
}

TEST(CudaTensor, RecordStreamDelaysReuseOfADeviceBlock) {
  FakeRuntime f;
  const cuda::Stream side = cuda::pooled_stream(0);
  void* block = nullptr;
  {
    Tensor t = zeros({100}, DType::f32, Device::cuda(0));
    block = t.raw_data();
    cuda::record_stream(t, side);
    f.fake.submit(side);
  }
  Tensor u = Tensor::empty({100}, DType::f32, Device::cuda(0));
  EXPECT_NE(u.raw_data(), block);
  side.synchronize();
  Tensor w = Tensor::empty({100}, DType::f32, Device::cuda(0));
  EXPECT_EQ(w.raw_data(), block);
  EXPECT_TRUE(contains(error_of([&] { cuda::record_stream(zeros({2}), side); }), "pageable"));
}

TEST(CudaTensor, ToDeviceIsDifferentiable) {
  FakeRuntime f;
  Tensor x = from_vector<float>({1, 2, 3}, {3}).set_requires_grad(true);
  Tensor y = x.to(Device::cuda(0));
  EXPECT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn()->name(), "ToDeviceBackward");
  Tensor z = y.to(Device::cpu());
  sum(z).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().device(), Device::cpu());
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{1, 1, 1}));
  EXPECT_TRUE(x.to(Device::cpu()).is_same(x));
}

TEST(CudaRuntime, FakeWithoutDevicesGivesTheSameErrors) {
  FakeRuntime f(0);
  const std::string msg = error_of([] { (void)Tensor::empty({2}, DType::f32, Device::cuda(0)); });
  EXPECT_EQ(msg,
            "no CUDA device: cannot allocate memory on cuda:0: the fake backend has no devices");
}

// ---- the real runtime without a GPU -----------------------------------------------------------

void expect_no_device_error(const std::string& msg) {
  EXPECT_TRUE(contains(msg, "no CUDA device")) << msg;
  EXPECT_TRUE(contains(msg, "built without CUDA") || contains(msg, "no CUDA driver or GPU") ||
              contains(msg, "reports no GPU"))
      << msg;
}

TEST(CudaRuntimeWithoutDevice, EveryEntryPointIsAClearError) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present; see tests/gpu";
  const Tensor host = from_vector<float>({1, 2}, {2});
  expect_no_device_error(error_of([] { (void)Tensor::empty({2}, DType::f32, Device::cuda(0)); }));
  expect_no_device_error(error_of([&] { (void)host.to(Device::cuda(0)); }));
  expect_no_device_error(error_of([] { (void)zeros({2}, DType::f32, Device::cuda(1)); }));
  expect_no_device_error(error_of([] { (void)Tensor::empty_pinned({2}); }));
  expect_no_device_error(error_of([&] { (void)host.pin_memory(); }));
  expect_no_device_error(error_of([] { cuda::DeviceGuard g(0); }));
  expect_no_device_error(error_of([] { (void)cuda::current_device(); }));
  expect_no_device_error(error_of([] { cuda::set_device(0); }));
  expect_no_device_error(error_of([] { cuda::synchronize(); }));
  expect_no_device_error(error_of([] { (void)cuda::current_stream(); }));
  expect_no_device_error(error_of([] { (void)cuda::pooled_stream(0); }));
  expect_no_device_error(error_of([] { (void)cuda::default_stream(0); }));
  expect_no_device_error(error_of([] { cuda::set_current_stream(cuda::Stream(0, nullptr)); }));
  expect_no_device_error(error_of([] { cuda::Event().record(); }));
  expect_no_device_error(error_of([] { cuda::Event().record(cuda::Stream(0, nullptr)); }));
  expect_no_device_error(error_of([] { (void)cuda::memory_stats(0); }));
  expect_no_device_error(error_of([] { cuda::reset_peak_memory_stats(); }));
  expect_no_device_error(error_of([] { (void)cuda::pinned_memory_stats(); }));
  expect_no_device_error(error_of([] { (void)allocator_for(Device::cuda(0)); }));
  // What needs no device still works.
  EXPECT_NO_THROW(cuda::empty_cache());
  EXPECT_NO_THROW({ cuda::DeviceGuard g(Device::cpu()); });
  EXPECT_TRUE(host.to(Device::cpu()).is_same(host));
  EXPECT_FALSE(host.is_pinned());
  cuda::Event never;
  EXPECT_TRUE(never.query());
}

}  // namespace
}  // namespace rg
