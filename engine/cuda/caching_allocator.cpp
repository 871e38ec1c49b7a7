// The per-device CUDA caching allocator: segments split into blocks, per-stream best-fit pools,
// merging of free neighbours, deferred release of blocks used on other streams (events).
#include "engine/cuda/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

#include "engine/cuda/graph.h"
#include "kernels/error.h"

namespace rg::cuda {

struct CachingAllocator::Block {
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

CachingAllocator::Block* CachingAllocator::find_free_block(Pool& pool, StreamHandle stream,
                                                           size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

void* CachingAllocator::allocate_segment(size_t size) {
  void* p = backend_.malloc_device(device_, size);
  if (p == nullptr) {
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
  RG_CHECK(!detail::graph_capture_active(), "CUDA allocation of ", format_bytes(nbytes),
           " on cuda:", device_,
           " during a CUDA graph capture: the caching allocator has no private memory pool for "
           "graphs yet, so a captured body must use tensors made before the capture and "
           "in-place ops (engine/cuda/graph.h)");
  std::lock_guard<std::mutex> lock(mu_);
  release_deferred_frees();
  process_events();
  const size_t size = round_up(nbytes, kMinBlockSize);
  const bool small = size <= kSmallRequest;
  Pool& pool = small ? small_pool_ : large_pool_;
  Block* b = find_free_block(pool, stream, size);
  if (b == nullptr) {
    const size_t segment = small                   ? kSmallSegment
                           : size < kMinLargeAlloc ? kLargeSegment
                                                   : round_up(size, kLargeRounding);
    void* p = allocate_segment(segment);
    if (p == nullptr) {
      RG_FAIL("CUDA out of memory on cuda:", device_, ": tried to allocate ", format_bytes(nbytes),
              " with ", format_bytes(size_t(stats_.allocated_bytes)), " allocated to tensors and ",
              format_bytes(size_t(stats_.reserved_bytes)),
              " reserved by the caching allocator (the cache was already released); free "
              "tensors or use a smaller batch");
    }
    b = new Block;
    b->stream = stream;
    b->size = segment;
    b->ptr = static_cast<char*>(p);
    b->small = small;
  }
  const size_t rest = b->size - size;
  if (small ? rest >= kMinBlockSize : rest > kSmallRequest) {
    Block* r = new Block;
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
  if (detail::graph_capture_active()) {
    // Its events would be recorded into the capture: freed once no capture is running.
    deferred_frees_.push_back(ptr);
    return;
  }
  release_deferred_frees();
  deallocate_locked(ptr);
}

void CachingAllocator::release_deferred_frees() {
  if (deferred_frees_.empty() || detail::graph_capture_active()) return;
  for (void* p : std::exchange(deferred_frees_, {})) deallocate_locked(p);
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
      if (b->prev != nullptr || b->next != nullptr) {  // part of a segment still in use
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
  release_cached_segments();
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
