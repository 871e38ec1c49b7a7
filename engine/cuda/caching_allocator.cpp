// The per-device CUDA caching allocator: segments split into blocks, per-stream best-fit pools,
// merging of free neighbours, deferred release of blocks used on other streams (events).
#include "engine/cuda/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

#include "kernels/error.h"

namespace rg::cuda {

struct CachingAllocator::Block {
  uint64_t graph_pool = 0;        // 0: the allocator's own pools; else a CUDA graph's
  StreamHandle stream = nullptr;  // the stream it was allocated on; its pool
  size_t size = 0;
  char* ptr = nullptr;
  bool small = false;  // which pool
  bool allocated = false;
  size_t requested = 0;  // while allocated
  int pending_events = 0;
  Block* prev = nullptr;  // neighbours within the segment
  Block* next = nullptr;
  std::vector<StreamHandle> stream_uses;  // other streams using it (record_stream)

  bool is_free() const { return !allocated && pending_events == 0; }
};

namespace {

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

std::string format_bytes(size_t n) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = double(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return std::to_string(n) + " bytes";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  if (a->graph_pool != b->graph_pool) return a->graph_pool < b->graph_pool;
  const auto sa = reinterpret_cast<uintptr_t>(a->stream);
  const auto sb = reinterpret_cast<uintptr_t>(b->stream);
  if (sa != sb) return sa < sb;
  if (a->size != b->size) return a->size < b->size;
  return std::less<const char*>()(a->ptr, b->ptr);
}

CachingAllocator::CachingAllocator(Backend& backend, int device)
    : backend_(backend), device_(device), events_(backend) {}

CachingAllocator::~CachingAllocator() {
  try {
    release_all();
  } catch (...) {  // a destructor cannot report; what the backend refused stays allocated
  }
}

CachingAllocator::Pool& CachingAllocator::pool_of(const Block* b) {
  return b->small ? small_pool_ : large_pool_;
}

CachingAllocator::Block* CachingAllocator::find_free_block(Pool& pool, uint64_t graph_pool,
                                                           StreamHandle stream, size_t size) {
  Block key;
  key.graph_pool = graph_pool;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->graph_pool != graph_pool || (*it)->stream != stream)
    return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

void* CachingAllocator::allocate_segment(size_t size, bool may_flush) {
  void* p = backend_.malloc_device(device_, size);
  if (p == nullptr && may_flush) {
    // The device is full: return what the cache holds (after the events it waits for) and retry.
    release_cached_segments();
    ++stats_.num_cache_flushes;
    p = backend_.malloc_device(device_, size);
  }
  if (p == nullptr) return nullptr;
  ++stats_.num_device_allocs;
  stats_.reserved_bytes += int64_t(size);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  return p;
}

void* CachingAllocator::allocate(size_t nbytes, StreamHandle stream) {
  if (nbytes == 0) return nullptr;
  RG_CHECK(nbytes <= (size_t(1) << 56), "CUDA allocation of ", nbytes, " bytes on cuda:", device_,
           " is impossibly large");
  std::lock_guard<std::mutex> lock(mu_);
  if (capturing_id_ == 0) process_events();  // (querying events would fail a capture)
  // The capture's own allocations come from its graph's pool.
  GraphPool* capture = capturing_pool();
  const uint64_t graph_pool = capture && capture->stream == stream ? capturing_id_ : 0;
  const size_t size = round_up(nbytes, kMinBlockSize);
  const bool small = size <= kSmallRequest;
  Pool& pool = small ? small_pool_ : large_pool_;
  Block* b = find_free_block(pool, graph_pool, stream, size);
  if (b == nullptr) {
    const size_t segment = small                   ? kSmallSegment
                           : size < kMinLargeAlloc ? kLargeSegment
                                                   : round_up(size, kLargeRounding);
    // Releasing the cache frees device memory, which would fail a capture.
    void* p = allocate_segment(segment, /*may_flush=*/capture == nullptr);
    if (p == nullptr) {
      RG_FAIL("CUDA out of memory on cuda:", device_, ": tried to allocate ", format_bytes(nbytes),
              " with ", format_bytes(size_t(stats_.allocated_bytes)), " allocated to tensors and ",
              format_bytes(size_t(stats_.reserved_bytes)), " reserved by the caching allocator",
              capture ? " (during a CUDA graph capture, which cannot release the cache)"
                      : " (the cache was already released)",
              "; free tensors or use a smaller batch");
    }
    if (graph_pool != 0) capture->segment_bytes += int64_t(segment);
    b = new Block;
    b->graph_pool = graph_pool;
    b->stream = stream;
    b->size = segment;
    b->ptr = static_cast<char*>(p);
    b->small = small;
  }
  const size_t rest = b->size - size;
  if (small ? rest >= kMinBlockSize : rest > kSmallRequest) {
    Block* r = new Block;
    r->graph_pool = graph_pool;
    r->stream = stream;
    r->size = rest;
    r->ptr = b->ptr + size;
    r->small = small;
    r->prev = b;
    r->next = b->next;
    if (b->next != nullptr) b->next->prev = r;
    b->next = r;
    b->size = size;
    pool.insert(r);
  }
  b->allocated = true;
  b->requested = nbytes;
  backend_.annotate_block_allocated(device_, b->ptr, b->size, stream);
  live_.emplace(b->ptr, b);
  ++stats_.num_allocs;
  stats_.allocated_bytes += int64_t(b->size);
  stats_.requested_bytes += int64_t(nbytes);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return b->ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  GraphPool* capture = capturing_pool();
  auto it = live_.find(ptr);
  if (capture != nullptr && it != live_.end()) {
    const Block* b = it->second;
    if (std::this_thread::get_id() == capture->thread && b->graph_pool != capturing_id_) {
      // The capture may have used it (the allocator's own block, or another graph's output): it
      // stays out of reach until the graph is destroyed.
      capture->held.push_back(ptr);
      return;
    }
    if (!b->stream_uses.empty()) {
      // Its events could be recorded into the capture (a stream of theirs may have joined it),
      // and querying them would then fail for good: freed when it ends. Also from other threads
      // (the NCCL watchdog dropping a finished collective's tensors).
      capture->deferred.push_back(ptr);
      return;
    }
  }
  deallocate_locked(ptr);
}

void CachingAllocator::deallocate_locked(void* ptr) {
  auto it = live_.find(ptr);
  RG_CHECK(it != live_.end(), "CUDA caching allocator of cuda:", device_, ": free of ", ptr,
           ", which it did not hand out (or which was freed already)");
  Block* b = it->second;
  live_.erase(it);
  b->allocated = false;
  stats_.allocated_bytes -= int64_t(b->size);
  stats_.requested_bytes -= int64_t(b->requested);
  b->requested = 0;
  backend_.annotate_block_freed(device_, b->ptr, b->size, b->stream, b->stream_uses);
  if (b->stream_uses.empty()) {
    free_block(b);
    return;
  }
  // Other streams may still be using the block: it goes back to the pool once each of them has
  // reached this point of its work.
  ++stats_.pending_free_blocks;
  for (StreamHandle s : b->stream_uses) {
    EventHandle e = events_.get(device_);
    backend_.record_event(device_, e, s);
    ++b->pending_events;
    pending_.push_back({e, b});
  }
  b->stream_uses.clear();
}

void CachingAllocator::free_block(Block* b) {
  Pool& pool = pool_of(b);
  if (b->prev != nullptr && b->prev->is_free()) {
    Block* p = b->prev;
    pool.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr) b->next->prev = p;
    delete b;
    b = p;
  }
  if (b->next != nullptr && b->next->is_free()) {
    Block* n = b->next;
    pool.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    delete n;
  }
  pool.insert(b);
  release_if_unused_graph_segment(b);
}

bool CachingAllocator::release_if_unused_graph_segment(Block* b) {
  if (b->graph_pool == 0 || b->prev != nullptr || b->next != nullptr || !b->is_free() ||
      capturing_id_ != 0)  // freeing device memory would fail the capture
    return false;
  auto it = graph_pools_.find(b->graph_pool);
  if (it == graph_pools_.end() || !it->second.released) return false;
  pool_of(b).erase(b);
  backend_.free_device(device_, b->ptr);
  ++stats_.num_device_frees;
  stats_.reserved_bytes -= int64_t(b->size);
  it->second.segment_bytes -= int64_t(b->size);
  if (it->second.segment_bytes == 0 && it->second.held.empty()) graph_pools_.erase(it);
  delete b;
  return true;
}

CachingAllocator::GraphPool* CachingAllocator::capturing_pool() {
  if (capturing_id_ == 0) return nullptr;
  return &graph_pools_.at(capturing_id_);
}

uint64_t CachingAllocator::begin_graph_pool(StreamHandle stream) {
  std::lock_guard<std::mutex> lock(mu_);
  RG_CHECK(capturing_id_ == 0, "cuda:", device_,
           ": a CUDA graph is already being captured on this device (one capture per device at "
           "a time)");
  const uint64_t id = next_graph_pool_++;
  GraphPool& p = graph_pools_[id];
  p.stream = stream;
  p.thread = std::this_thread::get_id();
  p.capturing = true;
  capturing_id_ = id;
  return id;
}

void CachingAllocator::end_graph_pool(StreamHandle stream) {
  std::lock_guard<std::mutex> lock(mu_);
  GraphPool* p = capturing_pool();
  RG_CHECK(p != nullptr && p->stream == stream, "cuda:", device_,
           ": end_graph_pool without a capture on that stream");
  p->capturing = false;
  capturing_id_ = 0;
  for (void* ptr : std::exchange(p->deferred, {})) deallocate_locked(ptr);
  release_unused_graph_segments();
}

void CachingAllocator::release_unused_graph_segments() {
  std::vector<Block*> candidates;
  for (Pool* pool : {&small_pool_, &large_pool_})
    for (Block* b : *pool)
      if (b->graph_pool != 0 && b->prev == nullptr && b->next == nullptr) candidates.push_back(b);
  for (Block* b : candidates) release_if_unused_graph_segment(b);
}

void CachingAllocator::release_graph_pool(uint64_t id,
                                          const std::vector<StreamHandle>& replayed_on) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = graph_pools_.find(id);
  if (it == graph_pools_.end()) return;
  GraphPool& p = it->second;
  if (p.capturing) {  // the capture failed and never ended
    p.capturing = false;
    capturing_id_ = 0;
  }
  p.released = true;
  std::vector<void*> back = std::exchange(p.held, {});
  for (void* d : std::exchange(p.deferred, {})) back.push_back(d);
  for (void* ptr : back) {
    // Reused only after the replays queued on other streams are done with it.
    Block* b = live_.at(ptr);
    for (StreamHandle s : replayed_on)
      if (s != b->stream &&
          std::find(b->stream_uses.begin(), b->stream_uses.end(), s) == b->stream_uses.end())
        b->stream_uses.push_back(s);
    deallocate_locked(ptr);
  }
  release_unused_graph_segments();
  // Erased by the last segment's release; a pool without segments goes now.
  auto again = graph_pools_.find(id);
  if (again != graph_pools_.end() && again->second.segment_bytes == 0 && again->second.held.empty())
    graph_pools_.erase(again);
}

int64_t CachingAllocator::graph_pool_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [id, p] : graph_pools_) n += p.segment_bytes;
  return n;
}

void CachingAllocator::process_events() {
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingEvent pe = pending_[i];
    if (!backend_.poll_event(device_, pe.event)) {
      pending_[kept++] = pe;
      continue;
    }
    events_.put(device_, pe.event);
    if (--pe.block->pending_events == 0) {
      --stats_.pending_free_blocks;
      backend_.annotate_block_released(pe.block->ptr, pe.block->size);
      free_block(pe.block);
    }
  }
  pending_.resize(kept);
}

void CachingAllocator::synchronize_and_process_events() {
  for (const PendingEvent& pe : pending_) backend_.synchronize_event(device_, pe.event);
  process_events();
}

void CachingAllocator::release_cached_segments() {
  synchronize_and_process_events();
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      // A segment still in use, or a graph's (freed with its pool).
      if (b->prev != nullptr || b->next != nullptr || b->graph_pool != 0) {
        ++it;
        continue;
      }
      backend_.free_device(device_, b->ptr);
      ++stats_.num_device_frees;
      stats_.reserved_bytes -= int64_t(b->size);
      it = pool->erase(it);
      delete b;
    }
  }
}

void CachingAllocator::release_all() {
  std::lock_guard<std::mutex> lock(mu_);
  synchronize_and_process_events();
  std::vector<Block*> blocks(small_pool_.begin(), small_pool_.end());
  blocks.insert(blocks.end(), large_pool_.begin(), large_pool_.end());
  for (const auto& [ptr, b] : live_) blocks.push_back(b);
  small_pool_.clear();
  large_pool_.clear();
  live_.clear();
  for (Block* b : blocks) {
    if (b->prev != nullptr) continue;
    // b heads a segment: free it and every block in it.
    backend_.free_device(device_, b->ptr);
    ++stats_.num_device_frees;
    while (b != nullptr) {
      Block* next = b->next;
      stats_.reserved_bytes -= int64_t(b->size);
      delete b;
      b = next;
    }
  }
}

void CachingAllocator::record_stream(void* ptr, StreamHandle stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  RG_CHECK(it != live_.end(), "record_stream on cuda:", device_, ": ", ptr,
           " is not the start of a live block of the caching allocator");
  Block* b = it->second;
  if (stream == b->stream) return;
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end()) {
    b->stream_uses.push_back(stream);
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  RG_CHECK(capturing_id_ == 0, "empty_cache on cuda:", device_,
           " during a CUDA graph capture (it would wait for events and free device memory)");
  release_cached_segments();
}

bool CachingAllocator::capturing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capturing_id_ != 0;
}

DeviceMemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

size_t CachingAllocator::block_size(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(const_cast<void*>(ptr));
  RG_CHECK(it != live_.end(), "block_size on cuda:", device_, ": ", ptr,
           " is not the start of a live block");
  return it->second->size;
}

}  // namespace rg::cuda
