// The pinned (page-locked) host memory allocator: blocks from cudaHostAlloc, cached by size class
// because pinning is expensive (the driver maps every page), and reused only after the
// asynchronous copies that read or write them are done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/cuda/backend.h"
#include "engine/cuda/event_pool.h"

namespace rg::cuda {

struct HostMemoryStats {
  int64_t allocated_bytes = 0;  // in blocks handed out now (sizes rounded to their class)
  int64_t peak_allocated_bytes = 0;
  int64_t reserved_bytes = 0;  // pinned now: live blocks plus the cache
  int64_t num_allocs = 0;
  int64_t num_host_allocs = 0;  // cudaHostAlloc calls
  int64_t num_host_frees = 0;   // cudaFreeHost calls
  int64_t pending_free_blocks = 0;
};

// Sizes round up to 4 KiB pages and then to 8 classes per power of two (at most 12.5% slack:
// pinned memory is taken from what the rest of the machine can page). A freed block is reused for
// the same class. record_stream() notes a stream whose queued copy uses the block; freeing it then
// records an event on each such stream and the block is reused only when those are reached.
// empty_cache() waits for those events and unpins every cached block. Thread-safe.
class PinnedAllocator {
 public:
  explicit PinnedAllocator(Backend& backend);
  ~PinnedAllocator();  // unpins everything, live blocks included
  PinnedAllocator(const PinnedAllocator&) = delete;
  PinnedAllocator& operator=(const PinnedAllocator&) = delete;

  static size_t size_class(size_t nbytes);

  void* allocate(size_t nbytes);  // nullptr for 0 bytes
  void deallocate(void* ptr);
  // ptr is the start of a live block; `stream` of `device` has queued work that uses it.
  void record_stream(void* ptr, int device, StreamHandle stream);
  void empty_cache();
  HostMemoryStats stats() const;
  void reset_peak_stats();

 private:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;
    bool allocated = false;
    int pending_events = 0;
    std::vector<std::pair<int, StreamHandle>> stream_uses;
  };
  struct PendingEvent {
    int device;
    EventHandle event;
    Block* block;
  };
  void process_events();
  void synchronize_and_process_events();
  void release_cached();

  Backend& backend_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> blocks_;     // every block, by address
  std::map<size_t, std::vector<Block*>> free_;  // by size class
  std::vector<PendingEvent> pending_;
  EventPool events_;
  HostMemoryStats stats_;
};

}  // namespace rg::cuda
