// CPU allocator (64-byte aligned, caching blocks >= 256 KiB by size class, with live/peak/
// reserved byte counters) and Storage; CUDA devices get engine/cuda's caching allocator.
#include "engine/storage.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/cuda/memory.h"
#include "engine/dtype.h"
#include "kernels/error.h"

namespace rg {
namespace {

std::atomic<int64_t> g_cpu_allocated{0};
std::atomic<int64_t> g_cpu_peak{0};
std::atomic<int64_t> g_cpu_reserved{0};

// Blocks of at least this size are cached: a training step frees and re-requests the same
// activation sizes every iteration, and reusing them avoids both page faults on fresh mmap'd
// memory and the heap fragmentation that made RSS grow far beyond the live tensor bytes.
constexpr size_t kCacheMinBytes = size_t(256) << 10;

// Sizes round up to 8 classes per power of two (at most 12.5% slack).
size_t size_class(size_t n) {
  if (n < kCacheMinBytes) return (n + 63) / 64 * 64;
  const int top = 63 - __builtin_clzll(n);
  const size_t step = size_t(1) << (top - 3);
  return (n + step - 1) / step * step;
}

constexpr size_t kHugePage = size_t(2) << 20;
// Recycling (CpuAllocator::recycle) only moves blocks of at least this size: ToyNet's 6.5 MiB
// activations, moved every step of 30 ms, cost it 5% of its speed; ResNet-18's 8 and 16 MiB ones
// hold most of what recycling saves there.
constexpr size_t kRecycleMinBytes = size_t(8) << 20;

// Cached blocks are mapped and unmapped by us, so that one given back leaves the resident set at
// once (freed through malloc it could stay in the heap, depending on glibc's moving mmap
// threshold). Blocks of 2 MiB and more are aligned to 2 MiB and asked to be transparent huge
// pages: faulting them in is ~10x cheaper (64 MiB: 2.5 ms against 23 ms with 4 KiB pages).
void* map_block(size_t cls) {
  const size_t extra = cls >= kHugePage ? kHugePage : 0;
  void* m = mmap(nullptr, cls + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  if (extra == 0) return m;
  const uintptr_t base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t p = (base + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
  if (p > base) munmap(m, p - base);
  if (p + cls < base + cls + extra) munmap(reinterpret_cast<void*>(p + cls), base + extra - p);
  madvise(reinterpret_cast<void*>(p), cls, MADV_HUGEPAGE);  // may fail: then 4 KiB pages
  return reinterpret_cast<void*>(p);
}
void unmap_block(void* p, size_t cls) { munmap(p, cls); }

// Transparent huge pages can be had ("always" or "madvise" selected).
bool huge_pages_available() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(f, line)) return false;
  return line.find("[always]") != std::string::npos || line.find("[madvise]") != std::string::npos;
}

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t cls = size_class(nbytes);
    void* p = nullptr;
    if (cls >= kCacheMinBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      used_[cls] = ++tick_;
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
      } else {
        if (recycling_ && cls >= kRecycleMinBytes) recycle(cls);
        p = map_block(cls);
        RG_CHECK(p != nullptr, "out of CPU memory allocating ", nbytes, " bytes");
        g_cpu_reserved.fetch_add(int64_t(cls));
        mapped_bytes_ += cls;
      }
      live_class_bytes_ += cls;
      high_water_ = std::max(high_water_, live_class_bytes_);
    }
    if (p == nullptr) {
      p = std::aligned_alloc(64, cls);
      RG_CHECK(p != nullptr, "out of CPU memory allocating ", nbytes, " bytes");
      g_cpu_reserved.fetch_add(int64_t(cls));
    }
    const int64_t now = g_cpu_allocated.fetch_add(int64_t(nbytes)) + int64_t(nbytes);
    int64_t peak = g_cpu_peak.load();
    while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now)) {
    }
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    g_cpu_allocated.fetch_sub(int64_t(nbytes));
    const size_t cls = size_class(nbytes);
    if (cls >= kCacheMinBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      free_[cls].push_back(ptr);
      used_[cls] = ++tick_;
      live_class_bytes_ -= cls;
      return;
    }
    g_cpu_reserved.fetch_sub(int64_t(cls));
    std::free(ptr);
  }
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, blocks] : free_) {
      for (void* p : blocks) {
        unmap_block(p, cls);
        g_cpu_reserved.fetch_sub(int64_t(cls));
        mapped_bytes_ -= cls;
      }
    }
    free_.clear();
    high_water_ = live_class_bytes_;
  }
  void set_recycling(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    recycling_ = on;
  }
  bool recycling() {
    std::lock_guard<std::mutex> lock(mu_);
    return recycling_;
  }

 private:
  // Before mapping a block of `cls` bytes (kRecycleMinBytes or more) on a miss: if the cached
  // blocks would then exceed the most bytes ever live in them at once, gives back idle blocks of
  // other classes of kRecycleMinBytes or more, the most recently used class first, until they do
  // not. A training step asks for each class's extra
  // blocks at a different moment (ResNet-18: two more activation-sized gradients where a
  // downsampling block's two convolutions meet, at every resolution); keeping all of them made
  // the footprint the sum of each class's own maximum, 58 MB above the peak of live bytes. The
  // class used last is the one the step has just left (the forward goes down the resolutions, the
  // backward up again), so its blocks are the ones needed latest; the blocks given back each step
  // are faulted in again, cheaply as huge pages.
  void recycle(size_t cls) {
    const size_t limit = std::max(high_water_, live_class_bytes_ + cls);
    if (mapped_bytes_ + cls <= limit) return;
    const size_t over = mapped_bytes_ + cls - limit;
    std::vector<size_t> classes;
    for (const auto& [c, blocks] : free_)
      if (c >= kRecycleMinBytes && !blocks.empty()) classes.push_back(c);
    std::sort(classes.begin(), classes.end(),
              [&](size_t a, size_t b) { return used_[a] > used_[b]; });
    size_t released = 0;
    for (size_t c : classes) {
      auto& blocks = free_[c];
      while (!blocks.empty() && released < over) {
        unmap_block(blocks.back(), c);
        blocks.pop_back();
        g_cpu_reserved.fetch_sub(int64_t(c));
        mapped_bytes_ -= c;
        released += c;
      }
      if (released >= over) break;
    }
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::unordered_map<size_t, uint64_t> used_;  // per class: tick of its last allocation or free
  uint64_t tick_ = 0;
  size_t mapped_bytes_ = 0;      // cached-class blocks mapped: in use or idle in free_
  size_t live_class_bytes_ = 0;  // of which in use
  size_t high_water_ = 0;        // the most of them ever at once (since cpu_empty_cache)
  // Only where huge pages make faulting returned blocks in again cheap: with 4 KiB pages it cost
  // ResNet-18 about 5% of its step.
  bool recycling_ = huge_pages_available();
};

// Never destroyed: tensors in static storage may be freed after main() returns.
CpuAllocator& cpu_allocator() {
  static CpuAllocator* a = new CpuAllocator();
  return *a;
}

}  // namespace

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  return cuda::device_storage_allocator(device.index);
}

CpuMemoryStats cpu_memory_stats() {
  return {g_cpu_allocated.load(), g_cpu_peak.load(), g_cpu_reserved.load()};
}
void cpu_empty_cache() { cpu_allocator().empty_cache(); }
void set_cpu_cache_recycling(bool on) { cpu_allocator().set_recycling(on); }
bool cpu_cache_recycling() { return cpu_allocator().recycling(); }
void reset_cpu_peak_bytes() { g_cpu_peak.store(g_cpu_allocated.load()); }

Storage::Storage(size_t nbytes, Device device) : Storage(nbytes, device, allocator_for(device)) {}

Storage::Storage(size_t nbytes, Device device, Allocator& allocator)
    : allocator_(&allocator), data_(allocator.allocate(nbytes)), nbytes_(nbytes), device_(device) {}

Storage::~Storage() { allocator_->deallocate(data_, nbytes_); }

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device parse_device(std::string_view name) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda") return Device::cuda(0);
  if (name.starts_with("cuda:") && name.size() > 5 && name.size() <= 8) {
    int index = 0;
    for (char ch : name.substr(5)) {
      RG_CHECK(ch >= '0' && ch <= '9', "unknown device '", name,
               "' (expected cpu, cuda or cuda:N)");
      index = index * 10 + (ch - '0');
    }
    return Device::cuda(index);
  }
  RG_FAIL("unknown device '", name, "' (expected cpu, cuda or cuda:N)");
}

size_t element_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::i64:
      return 8;
    case DType::i32:
      return 4;
    case DType::u8:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i64:
      return "i64";
    case DType::i32:
      return "i32";
    case DType::u8:
      return "u8";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  for (DType t :
       {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8})
    if (name == dtype_name(t)) return t;
  RG_FAIL("unknown dtype '", name, "' (expected f32, f64, f16, bf16, i64, i32 or u8)");
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

}  // namespace rg
