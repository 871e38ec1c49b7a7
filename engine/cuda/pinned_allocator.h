// The pinned (page-locked) host memory allocator: blocks from cudaHostAlloc, cached by size class
// because pinning is expensive (the driver maps every page), and reused only after the
// asynchronous copies that read or write them are done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
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
  int64_t num_host_allocs = 0;      // cudaHostAlloc calls
  int64_t num_host_frees = 0;       // cudaFreeHost calls
  int64_t pending_free_blocks = 0;  // freed, not reusable yet (copies, a graph, a capture)
};

// Sizes round up to 4 KiB pages and then to 8 classes per power of two (at most 12.5% slack:
// pinned memory is taken from what the rest of the machine can page). A freed block is reused for
// the same class. record_stream() notes a stream whose queued copy uses the block; freeing it then
// records an event on each such stream and the block is reused only when those are reached.
// empty_cache() waits for those events and unpins every cached block. Thread-safe. A free whose
// events cannot be recorded (a CUDA error) throws and keeps the block: it is tried again at each
// allocation, and empty_cache() throws the error while it persists.
//
// CUDA graphs (engine/cuda/graph.h call begin_capture, end_capture and release_graph): a block
// that a stream of a capture uses (record_stream while that stream is captured) is read or
// written by every replay, so it belongs to the graph until the graph is destroyed: freed before
// that, it waits, and it is reused only after the streams the graph was replayed on reach the
// graph's destruction (used by several graphs: the last one's). While any capture runs no event
// is queried (CUDA forbids it) nor recorded (the stream could be part of the capture, and the
// event would then fail every later query): allocations take cached blocks or pin new ones,
// blocks freed with stream uses wait for the last capture's end, and empty_cache() is an error.
// A stream captured by something other than a cuda::Graph (a raw cudaStreamBeginCapture) cannot
// use pinned blocks: record_stream refuses it. (record_stream is called before the copy is
// queued: a stream that another thread joins to a capture between the two is not seen.) A block
// freed while a stream it was used on is under such a capture (begun after its copy) waits for
// the first allocation after that capture.
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
  bool capturing() const;  // a cuda::Graph captures now (on any device)
  // A cuda::Graph (`graph`, its unique id) starts capturing on `device`; its capture ended
  // (successfully or not); it was destroyed after its replays were queued on `replayed_on`
  // (streams of its device).
  void begin_capture(uint64_t graph, int device);
  void end_capture(uint64_t graph);
  void release_graph(uint64_t graph, const std::vector<StreamHandle>& replayed_on);
  HostMemoryStats stats() const;
  void reset_peak_stats();

 private:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;
    bool allocated = false;
    int pending_events = 0;
    int graphs = 0;        // the live graphs whose captures used it
    bool waiting = false;  // freed, but held for its graph or for the captures' end
    std::vector<std::pair<int, StreamHandle>> stream_uses;
  };
  struct GraphUse {
    int device = 0;
    bool capturing = true;
    std::vector<Block*> used;  // blocks its capture used (each counted in Block::graphs)
  };
  struct PendingEvent {
    int device;
    EventHandle event;
    Block* block;
  };
  // Back to the cache, after events on the streams that used it; deferred while one of those
  // streams is captured. On an error (querying a stream's capture, recording an event) the
  // block is deferred and the error rethrown.
  void free_locked(Block* b);
  void defer(Block* b);  // freed, waits in deferred_
  // Frees the waiting blocks of deferred_ (no capture runs). A block that cannot be freed (an
  // event it needs cannot be recorded) stays deferred; the first such error is returned.
  std::exception_ptr free_deferred();
  void process_events();
  void synchronize_and_process_events();
  void release_cached();

  Backend& backend_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> blocks_;     // every block, by address
  std::map<size_t, std::vector<Block*>> free_;  // by size class
  std::vector<PendingEvent> pending_;
  std::unordered_map<uint64_t, GraphUse> graphs_;  // live cuda::Graphs, by id
  int captures_ = 0;                               // captures running now
  std::vector<Block*> deferred_;                   // freed during captures, with stream uses
  EventPool events_;
  HostMemoryStats stats_;
};

}  // namespace rg::cuda
