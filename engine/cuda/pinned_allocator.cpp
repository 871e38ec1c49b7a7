// Pinned host memory: cudaHostAlloc blocks cached by size class, released for reuse only when
// the copies that were queued on them are done.
#include "engine/cuda/pinned_allocator.h"

#include <algorithm>

#include "kernels/error.h"

namespace rg::cuda {

PinnedAllocator::PinnedAllocator(Backend& backend) : backend_(backend), events_(backend) {}

PinnedAllocator::~PinnedAllocator() {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    synchronize_and_process_events();
    for (auto& [ptr, b] : blocks_) backend_.free_host(ptr);
  } catch (...) {  // a destructor cannot report; what the backend refused stays pinned
  }
}

size_t PinnedAllocator::size_class(size_t nbytes) {
  constexpr size_t kPage = 4096;
  const size_t n = (nbytes + kPage - 1) / kPage * kPage;
  if (n <= 8 * kPage) return n;
  const int top = 63 - __builtin_clzll(n);
  const size_t step = size_t(1) << (top - 3);
  return (n + step - 1) / step * step;
}

void* PinnedAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  RG_CHECK(nbytes <= (size_t(1) << 56), "pinned allocation of ", nbytes,
           " bytes is impossibly large");
  const size_t cls = size_class(nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (captures_ == 0) {  // (querying events would fail a capture)
    // Blocks that a capture held up may be free now; one whose events cannot be recorded yet
    // waits for the next try (empty_cache reports it).
    free_deferred();
    process_events();
  }
  Block* b = nullptr;
  auto it = free_.find(cls);
  if (it != free_.end() && !it->second.empty()) {
    b = it->second.back();
    it->second.pop_back();
  } else {
    void* p = backend_.malloc_host(cls);
    if (p == nullptr && captures_ == 0) {  // unpinning the cache would fail a capture
      release_cached();
      p = backend_.malloc_host(cls);
    }
    RG_CHECK(p != nullptr, "out of pinned host memory allocating ", nbytes, " bytes (",
             stats_.reserved_bytes, " bytes pinned already",
             captures_ > 0 ? ", during a CUDA graph capture, which cannot unpin the cache" : "",
             ")");
    ++stats_.num_host_allocs;
    stats_.reserved_bytes += int64_t(cls);
    b = &blocks_[p];
    b->ptr = p;
    b->size = cls;
  }
  b->allocated = true;
  backend_.annotate_host_block_allocated(b->ptr, b->size);
  ++stats_.num_allocs;
  stats_.allocated_bytes += int64_t(cls);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return b->ptr;
}

void PinnedAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(ptr);
  RG_CHECK(it != blocks_.end() && it->second.allocated, "pinned allocator: free of ", ptr,
           ", which it did not hand out (or which was freed already)");
  Block* b = &it->second;
  b->allocated = false;
  stats_.allocated_bytes -= int64_t(b->size);
  if (b->graphs > 0) {
    // Its graph's replays use it: it waits for release_graph, still in use as far as the race
    // detector knows.
    b->waiting = true;
    ++stats_.pending_free_blocks;
    return;
  }
  if (captures_ > 0 && !b->stream_uses.empty()) {
    defer(b);  // its events could be captured
    return;
  }
  free_locked(b);
}

void PinnedAllocator::defer(Block* b) {
  b->waiting = true;
  ++stats_.pending_free_blocks;
  deferred_.push_back(b);
}

void PinnedAllocator::free_locked(Block* b) {
  bool held = false;
  std::vector<PendingEvent> recorded;
  try {
    for (const auto& [device, stream] : b->stream_uses) {
      // A stream captured by a raw cudaStreamBeginCapture since its copy was queued: an event
      // recorded on it now would be captured and fail every later query. The block waits for
      // an allocation after that capture (free_deferred).
      if (backend_.stream_capturing(device, stream)) {
        held = true;
        break;
      }
    }
    if (!held) {
      recorded.reserve(b->stream_uses.size());
      for (const auto& [device, stream] : b->stream_uses) {
        recorded.push_back({device, events_.get(device), b});
        backend_.record_event(device, recorded.back().event, stream);
      }
      backend_.annotate_host_block_freed(b->ptr, b->size, b->stream_uses);
      pending_.reserve(pending_.size() + recorded.size());
      free_[b->size].reserve(free_[b->size].size() + 1);
    }
  } catch (...) {
    // Nothing changed: the block waits to be freed again, the events go back to the pool (one
    // that was recorded is simply recorded again when it is next used).
    for (const PendingEvent& pe : recorded) events_.put(pe.device, pe.event);
    defer(b);
    throw;
  }
  if (held) {
    defer(b);
    return;
  }
  // (Nothing below throws: the room was reserved above.)
  b->stream_uses.clear();
  if (recorded.empty()) {
    free_[b->size].push_back(b);
    return;
  }
  ++stats_.pending_free_blocks;
  b->pending_events = int(recorded.size());
  pending_.insert(pending_.end(), recorded.begin(), recorded.end());
}

void PinnedAllocator::record_stream(void* ptr, int device, StreamHandle stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(ptr);
  RG_CHECK(it != blocks_.end() && it->second.allocated, "pinned record_stream: ", ptr,
           " is not the start of a live pinned block");
  Block* b = &it->second;
  if (backend_.stream_capturing(device, stream)) {
    // Used by a capture: by the capture of this device's cuda::Graph (one per device at a time).
    auto g = std::find_if(graphs_.begin(), graphs_.end(), [&](const auto& kv) {
      return kv.second.capturing && kv.second.device == device;
    });
    RG_CHECK(g != graphs_.end(), "pinned memory used on a stream of cuda:", device,
             " that is captured by something other than rg::cuda::Graph (a raw stream capture); "
             "the allocator could not keep the block for the graph's replays: capture through "
             "rg::cuda::Graph (engine/cuda/graph.h)");
    std::vector<Block*>& used = g->second.used;
    if (std::find(used.begin(), used.end(), b) == used.end()) {
      used.push_back(b);
      ++b->graphs;
    }
  }
  const std::pair<int, StreamHandle> use{device, stream};
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), use) == b->stream_uses.end())
    b->stream_uses.push_back(use);
}

void PinnedAllocator::begin_capture(uint64_t graph, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, g] : graphs_)
    RG_CHECK(!(g.capturing && g.device == device), "pinned allocator: graph ", graph,
             " begins capturing on cuda:", device, " while graph ", id, " captures there");
  auto [it, inserted] = graphs_.try_emplace(graph);
  RG_CHECK(inserted, "pinned allocator: graph ", graph, " began capturing twice");
  it->second.device = device;
  ++captures_;
}

void PinnedAllocator::end_capture(uint64_t graph) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = graphs_.find(graph);
  if (it == graphs_.end() || !it->second.capturing) return;
  it->second.capturing = false;
  if (--captures_ == 0) free_deferred();
}

std::exception_ptr PinnedAllocator::free_deferred() {
  std::exception_ptr first_error;
  for (Block* b : std::exchange(deferred_, {})) {
    --stats_.pending_free_blocks;
    b->waiting = false;
    try {
      free_locked(b);  // may defer it again
    } catch (...) {    // deferred again by free_locked
      if (!first_error) first_error = std::current_exception();
    }
  }
  return first_error;
}

void PinnedAllocator::release_graph(uint64_t graph, const std::vector<StreamHandle>& replayed_on) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = graphs_.find(graph);
  if (it == graphs_.end()) return;
  GraphUse g = std::move(it->second);
  graphs_.erase(it);
  if (g.capturing) --captures_;  // a capture that failed without end_capture
  for (Block* b : g.used) {
    --b->graphs;
    // Reused only after the replays queued on other streams are done with it.
    for (StreamHandle s : replayed_on) {
      const std::pair<int, StreamHandle> use{g.device, s};
      if (std::find(b->stream_uses.begin(), b->stream_uses.end(), use) == b->stream_uses.end())
        b->stream_uses.push_back(use);
    }
    // Free and no other graph's: back after those streams (a live one's free will wait for them).
    if (b->waiting && b->graphs == 0) deferred_.push_back(b);
  }
  if (captures_ == 0) free_deferred();
}

void PinnedAllocator::process_events() {
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingEvent pe = pending_[i];
    if (!backend_.poll_event(pe.device, pe.event)) {
      pending_[kept++] = pe;
      continue;
    }
    events_.put(pe.device, pe.event);
    if (--pe.block->pending_events == 0) {
      --stats_.pending_free_blocks;
      backend_.annotate_block_released(pe.block->ptr, pe.block->size);
      free_[pe.block->size].push_back(pe.block);
    }
  }
  pending_.resize(kept);
}

void PinnedAllocator::synchronize_and_process_events() {
  for (const PendingEvent& pe : pending_) backend_.synchronize_event(pe.device, pe.event);
  process_events();
}

void PinnedAllocator::release_cached() {
  synchronize_and_process_events();
  for (auto& [cls, list] : free_) {
    for (Block* b : list) {
      void* p = b->ptr;
      backend_.free_host(p);
      ++stats_.num_host_frees;
      stats_.reserved_bytes -= int64_t(cls);
      blocks_.erase(p);
    }
  }
  free_.clear();
}

void PinnedAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  RG_CHECK(captures_ == 0,
           "pinned empty_cache during a CUDA graph capture (it would wait for "
           "events and unpin memory)");
  const std::exception_ptr error = free_deferred();
  release_cached();
  if (error) std::rethrow_exception(error);
}

bool PinnedAllocator::capturing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return captures_ > 0;
}

HostMemoryStats PinnedAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void PinnedAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

}  // namespace rg::cuda
