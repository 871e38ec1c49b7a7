// The CUDA runtime state: device checks with clear errors, the per-device caching allocators and
// their Storage adapters, the pinned allocator, stream pools and per-thread current streams.
#include "engine/cuda/runtime.h"

#include "engine/trace.h"
#include "kernels/error.h"

namespace rg::cuda {
namespace {

// A host-blocking call while tracing: an instant on the host lane, category "host stall", which
// ringgrad-bench profile counts per step (the emulated runtime reports them;
// engine/cuda/backend.h).
void record_host_stall(const char* call) {
  if (trace::enabled()) trace::instant(call, "host stall", trace::Clock::now());
}

// A cuDNN descriptor created while tracing: an instant on the host lane, category "cudnn
// descriptor", also counted per step by ringgrad-bench profile (the emulated cuDNN reports them).
void record_library_object(const char* function) {
  if (trace::enabled()) trace::instant(function, "cudnn descriptor", trace::Clock::now());
}

std::atomic<uint64_t> g_generation{0};
std::atomic<Runtime*> g_override{nullptr};

// Each thread's current stream per device. Belongs to one runtime (by generation); a thread that
// meets another runtime starts again from the default streams.
struct ThreadStreams {
  uint64_t generation = 0;
  std::vector<StreamHandle> current;
};
thread_local ThreadStreams t_streams;

}  // namespace

class Runtime::DeviceStorageAllocator final : public Allocator {
 public:
  DeviceStorageAllocator(Runtime& rt, CachingAllocator& a, int device)
      : rt_(rt), a_(a), device_(device) {}
  void* allocate(size_t nbytes) override {
    return a_.allocate(nbytes, rt_.current_stream(device_));
  }
  void deallocate(void* ptr, size_t) override { a_.deallocate(ptr); }

 private:
  Runtime& rt_;
  CachingAllocator& a_;
  int device_;
};

class Runtime::PinnedStorageAllocator final : public Allocator {
 public:
  explicit PinnedStorageAllocator(PinnedAllocator& a) : a_(a) {}
  void* allocate(size_t nbytes) override { return a_.allocate(nbytes); }
  void deallocate(void* ptr, size_t) override { a_.deallocate(ptr); }
  bool pinned() const override { return true; }

 private:
  PinnedAllocator& a_;
};

Runtime::Runtime(Backend& backend)
    : backend_(backend), device_count_(backend.device_count()), generation_(++g_generation) {
  backend_.set_host_blocking_observer(&record_host_stall);
  backend_.set_library_object_observer(&record_library_object);
  for (int d = 0; d < device_count_; ++d) {
    allocators_.push_back(std::make_unique<CachingAllocator>(backend_, d));
    storage_allocators_.push_back(
        std::make_unique<DeviceStorageAllocator>(*this, *allocators_.back(), d));
  }
  pinned_ = std::make_unique<PinnedAllocator>(backend_);
  pinned_storage_ = std::make_unique<PinnedStorageAllocator>(*pinned_);
  pools_.resize(size_t(device_count_));
  pool_next_.resize(size_t(device_count_));
}

Runtime::~Runtime() = default;

int Runtime::check_device(int device, const char* what) const {
  if (device_count_ == 0) {
    RG_FAIL("no CUDA device: cannot ", what, " on cuda:", device < 0 ? 0 : device, ": ",
            backend_.unavailable_reason());
  }
  if (device < 0) device = backend_.current_device();
  RG_CHECK(device < device_count_, "cannot ", what, " on cuda:", device,
           ": that device does not exist (", device_count_, " CUDA device",
           device_count_ == 1 ? "" : "s", " visible)");
  return device;
}

CachingAllocator& Runtime::device_allocator(int device) {
  return *allocators_[size_t(check_device(device, "use the caching allocator"))];
}

Allocator& Runtime::storage_allocator(int device) {
  return *storage_allocators_[size_t(check_device(device, "allocate memory"))];
}

PinnedAllocator& Runtime::pinned_allocator() {
  if (device_count_ == 0) {
    RG_FAIL("no CUDA device: cannot pin host memory: ", backend_.unavailable_reason());
  }
  return *pinned_;
}

Allocator& Runtime::pinned_storage_allocator() {
  pinned_allocator();  // the check
  return *pinned_storage_;
}

StreamHandle Runtime::current_stream(int device) const {
  ThreadStreams& t = t_streams;
  if (t.generation != generation_) return nullptr;
  return t.current[size_t(device)];
}

void Runtime::set_current_stream(int device, StreamHandle stream) {
  ThreadStreams& t = t_streams;
  if (t.generation != generation_) {
    t.generation = generation_;
    t.current.assign(size_t(device_count_), nullptr);
  }
  t.current[size_t(device)] = stream;
}

StreamHandle Runtime::pooled_stream(int device) {
  device = check_device(device, "get a stream");
  std::lock_guard<std::mutex> lock(pool_mu_);
  auto& pool = pools_[size_t(device)];
  const uint32_t slot = pool_next_[size_t(device)]++ % uint32_t(kStreamPoolSize);
  if (slot == pool.size()) pool.push_back(backend_.create_stream(device));
  return pool[slot];
}

Runtime& runtime() {
  if (Runtime* r = g_override.load(std::memory_order_acquire)) return *r;
  // Never destroyed: tensors in static storage may be freed after main() returns.
  static Runtime* system = new Runtime(system_backend());
  return *system;
}

ScopedRuntime::ScopedRuntime(Runtime& r) : previous_(g_override.exchange(&r)) {}
ScopedRuntime::~ScopedRuntime() { g_override.store(previous_); }

}  // namespace rg::cuda
