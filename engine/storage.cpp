// CPU allocator (64-byte aligned, caching blocks >= 256 KiB by size class, with live/peak/
// reserved byte counters) and Storage; CUDA devices get engine/cuda's caching allocator.
#include "engine/storage.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
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

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t cls = size_class(nbytes);
    void* p = nullptr;
    if (cls >= kCacheMinBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
      }
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
      return;
    }
    g_cpu_reserved.fetch_sub(int64_t(cls));
    std::free(ptr);
  }
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, blocks] : free_) {
      for (void* p : blocks) {
        std::free(p);
        g_cpu_reserved.fetch_sub(int64_t(cls));
      }
    }
    free_.clear();
  }

 private:
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
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

}  // namespace rg
