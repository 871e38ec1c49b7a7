// The process's CUDA runtime state: the backend, one caching allocator per device, the pinned
// host allocator, the stream pools and each thread's current streams. Tests swap in a runtime over
// a fake backend (ScopedRuntime) to run all of it on the CPU.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/cuda/backend.h"
#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/pinned_allocator.h"
#include "engine/storage.h"

namespace rg::cuda {

class Runtime {
 public:
  // Streams handed out round-robin per device by pooled_stream().
  static constexpr int kStreamPoolSize = 32;

  explicit Runtime(Backend& backend);  // `backend` must outlive the runtime
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Backend& backend() const { return backend_; }
  int device_count() const { return device_count_; }
  // Throws rg::Error "no CUDA device: cannot <what> on cuda:<device>: <why>" or "... does not
  // exist" unless `device` is visible. device < 0 means the current device; returns the index.
  int check_device(int device, const char* what) const;

  CachingAllocator& device_allocator(int device);  // checked
  Allocator& storage_allocator(int device);        // checked; allocates on the current stream
  PinnedAllocator& pinned_allocator();             // needs a device
  Allocator& pinned_storage_allocator();

  // The calling thread's current stream of `device` (unchecked); the legacy default stream
  // (nullptr) until set.
  StreamHandle current_stream(int device) const;
  void set_current_stream(int device, StreamHandle stream);
  StreamHandle pooled_stream(int device);  // checked

 private:
  class DeviceStorageAllocator;
  class PinnedStorageAllocator;

  Backend& backend_;
  const int device_count_;
  const uint64_t generation_;  // tells a thread's stream table which runtime it belongs to
  std::vector<std::unique_ptr<CachingAllocator>> allocators_;
  std::vector<std::unique_ptr<Allocator>> storage_allocators_;
  std::unique_ptr<PinnedAllocator> pinned_;
  std::unique_ptr<Allocator> pinned_storage_;
  std::mutex pool_mu_;
  std::vector<std::vector<StreamHandle>> pools_;  // by device, created on first hand-out
  std::vector<uint32_t> pool_next_;
};

// The runtime in use: the one over system_backend() unless a ScopedRuntime is active.
Runtime& runtime();

// Makes `r` the process's runtime until destroyed (tests; not thread-safe against CUDA work that
// is running meanwhile). Tensors allocated under `r` must be freed before `r` is destroyed.
class ScopedRuntime {
 public:
  explicit ScopedRuntime(Runtime& r);
  ~ScopedRuntime();
  ScopedRuntime(const ScopedRuntime&) = delete;
  ScopedRuntime& operator=(const ScopedRuntime&) = delete;

 private:
  Runtime* previous_;
};

}  // namespace rg::cuda
