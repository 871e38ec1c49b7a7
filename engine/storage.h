// Storage: one allocation shared by a tensor and all its views, with a version counter that
// in-place ops bump so autograd can detect saved tensors that were modified.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/device.h"

namespace rg {

// Device memory provider. CPU: 64-byte aligned blocks; blocks of 256 KiB and more are mapped
// (2 MiB and more as transparent huge pages), cached per size class (8 per power of two) and
// reused, and returned by recycling (below) or cpu_empty_cache().
// CUDA: the caching allocator of the device (engine/cuda/caching_allocator.h), allocating for the
// current stream; pinned host memory comes from cuda::pinned_storage_allocator().
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  // Page-locked host memory: copies to and from it can run asynchronously.
  virtual bool pinned() const { return false; }
};

// Throws rg::Error for a CUDA device when there is none ("no CUDA device: ...").
Allocator& allocator_for(Device device);

struct CpuMemoryStats {
  int64_t allocated_bytes;  // live now
  int64_t peak_bytes;       // high-water mark since start or last reset
  int64_t reserved_bytes;   // held from the system: live plus cached free blocks
};
CpuMemoryStats cpu_memory_stats();
void reset_cpu_peak_bytes();
// Returns cached free blocks to the system (and restarts the high-water mark that recycling
// keeps the cache under).
void cpu_empty_cache();
// Recycling: a cache miss for 8 MiB or more that would make the cached blocks (in use or idle)
// exceed the most bytes ever in use in them at once first gives back idle blocks of other size
// classes of 8 MiB or more, the most recently used class first. On by default where transparent
// huge pages are available.
void set_cpu_cache_recycling(bool on);
bool cpu_cache_recycling();

class Storage {
 public:
  Storage(size_t nbytes, Device device);  // from allocator_for(device)
  Storage(size_t nbytes, Device device, Allocator& allocator);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  Allocator& allocator() const { return *allocator_; }
  bool pinned() const { return allocator_->pinned(); }
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  Allocator* allocator_;  // the one that allocated data_ frees it
  void* data_;
  size_t nbytes_;
  Device device_;
  uint64_t version_ = 0;
};

}  // namespace rg
