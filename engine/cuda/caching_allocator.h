// The CUDA caching allocator of one device: memory is taken from the device in segments, split
// into blocks and kept in per-stream pools when freed, so a training step that re-requests the
// same sizes every iteration never calls cudaMalloc/cudaFree once it has run once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/cuda/backend.h"
#include "engine/cuda/event_pool.h"

namespace rg::cuda {

struct DeviceMemoryStats {
  int64_t allocated_bytes = 0;       // in blocks handed out now (sizes rounded up to 512 bytes)
  int64_t peak_allocated_bytes = 0;  // high-water mark since creation or reset_peak_stats()
  int64_t requested_bytes = 0;       // what the callers of the live blocks asked for
  int64_t reserved_bytes = 0;        // taken from the device: live blocks plus the cache
  int64_t peak_reserved_bytes = 0;
  int64_t num_allocs = 0;           // allocate() calls that returned a block
  int64_t num_device_allocs = 0;    // segments taken from the device (cudaMalloc calls)
  int64_t num_device_frees = 0;     // segments given back (cudaFree calls)
  int64_t num_cache_flushes = 0;    // the device was full: the cache was released and retried
  int64_t pending_free_blocks = 0;  // freed, waiting for other streams to finish with them
};

// Policy (after PyTorch's CUDACachingAllocator):
// - Sizes round up to a multiple of kMinBlockSize. Requests up to kSmallRequest come from the
//   small pool, carved from kSmallSegment segments; larger ones from the large pool, carved from
//   kLargeSegment segments (requests below kMinLargeAlloc) or from a segment of their own size
//   rounded up to kLargeRounding.
// - A free block belongs to the pool of the stream it was allocated on and is reused only by
//   allocations on that stream: work queued on one stream runs in order, so the next user of the
//   block cannot overtake the last. The smallest free block that fits is taken (best fit, then
//   lowest address); the rest is split off when it is at least kMinBlockSize (small pool) or
//   larger than kSmallRequest (large pool, so large segments do not crumble into small blocks).
//   Freed neighbours within a segment merge again.
// - A block that was used on other streams (record_stream) is released only when an event
//   recorded on each of those streams at free time has been reached.
// - When the device has no room, every cached unsplit segment is returned and the allocation is
//   retried once; then an rg::Error says how much was asked for, allocated and reserved.
// - empty_cache() waits for pending events and returns every cached unsplit segment.
// - CUDA graphs (engine/cuda/graph.h): between begin_graph_pool(stream) and end_graph_pool, the
//   allocations on that stream come from a private pool of segments of their own (taken from the
//   device in relaxed capture mode), and its blocks freed then are reused by the capture's later
//   allocations (a replay repeats the same order on one stream). Other blocks (the allocator's
//   own, another graph's) that the capturing thread frees during the capture are held by it: the
//   graph may use them, so nothing else may get them while it can replay. After the capture the
//   pool keeps its memory: its blocks still handed out (the graph's outputs) are the graph's
//   static tensors, and the freed ones are not reused. When the graph is destroyed,
//   release_graph_pool() hands the held blocks back (after the work of the streams it was replayed
//   on) and returns the pool's segments to the device once all their blocks are free. During a
//   capture the allocator queries no event (CUDA forbids it then): pending frees wait, a graph
//   block used on other streams is freed at the capture's end, and empty_cache() is an error.
//   One capture per device at a time.
// Thread-safe (one mutex). Destroying the allocator returns all its memory to the device, blocks
// still handed out included; the process-wide allocators are never destroyed.
class CachingAllocator {
 public:
  static constexpr size_t kMinBlockSize = 512;
  static constexpr size_t kSmallRequest = size_t(1) << 20;
  static constexpr size_t kSmallSegment = size_t(2) << 20;
  static constexpr size_t kLargeSegment = size_t(20) << 20;
  static constexpr size_t kMinLargeAlloc = size_t(10) << 20;
  static constexpr size_t kLargeRounding = size_t(2) << 20;

  CachingAllocator(Backend& backend, int device);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  int device() const { return device_; }
  // A block of at least nbytes for work on `stream`; nullptr for 0 bytes.
  void* allocate(size_t nbytes, StreamHandle stream);
  // Returns the block at ptr (as returned by allocate) to its stream's pool; nullptr is ignored.
  void deallocate(void* ptr);
  // The block at ptr is also used by work on `stream`: it is reused only after that work is done.
  void record_stream(void* ptr, StreamHandle stream);
  void empty_cache();
  bool capturing() const;  // a cuda::Graph of this device captures now
  DeviceMemoryStats stats() const;
  void reset_peak_stats();
  // The size of the live block at ptr (rounded), for tests and diagnostics.
  size_t block_size(const void* ptr) const;
  // A CUDA graph's private pool (see above): allocations on `stream` come from the returned pool
  // until end_graph_pool(stream); release_graph_pool(id) once the graph is destroyed.
  uint64_t begin_graph_pool(StreamHandle stream);
  void end_graph_pool(StreamHandle stream);
  void release_graph_pool(uint64_t id, const std::vector<StreamHandle>& replayed_on = {});
  // The bytes of device segments held by graph pools (part of reserved_bytes).
  int64_t graph_pool_bytes() const;

 private:
  struct Block;
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockLess>;

  struct GraphPool {
    StreamHandle stream = nullptr;  // while capturing
    std::thread::id thread;         // the capturing thread
    bool capturing = false, released = false;
    int64_t segment_bytes = 0;
    std::vector<void*> held;      // default-pool blocks freed during the capture
    std::vector<void*> deferred;  // its own blocks freed during the capture with stream uses
  };

  Pool& pool_of(const Block* b);
  Block* find_free_block(Pool& pool, uint64_t graph_pool, StreamHandle stream, size_t size);
  void* allocate_segment(size_t size, bool may_flush);
  // A released graph pool's segment whose blocks are all free goes back to the device.
  bool release_if_unused_graph_segment(Block* b);
  // After a capture: the released pools' segments that became free meanwhile.
  void release_unused_graph_segments();
  GraphPool* capturing_pool();
  void free_block(Block* b);
  void deallocate_locked(void* ptr);
  void process_events();
  void synchronize_and_process_events();
  void release_cached_segments();
  void release_all();

  Backend& backend_;
  const int device_;
  mutable std::mutex mu_;
  Pool small_pool_;
  Pool large_pool_;
  std::unordered_map<void*, Block*> live_;  // handed out, by address
  struct PendingEvent {
    EventHandle event;
    Block* block;
  };
  std::vector<PendingEvent> pending_;  // events recorded for freed blocks, oldest first
  std::unordered_map<uint64_t, GraphPool> graph_pools_;
  uint64_t next_graph_pool_ = 1;
  uint64_t capturing_id_ = 0;  // the graph pool of the capture running now, or 0
  EventPool events_;
  DeviceMemoryStats stats_;
};

}  // namespace rg::cuda
