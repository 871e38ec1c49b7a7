// CPU allocator (64-byte aligned, with live/peak byte counters) and Storage.
#include "engine/storage.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include "engine/dtype.h"
#include "kernels/error.h"

namespace rg {
namespace {

std::atomic<int64_t> g_cpu_allocated{0};
std::atomic<int64_t> g_cpu_peak{0};

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    RG_CHECK(p != nullptr, "out of CPU memory allocating ", nbytes, " bytes");
    const int64_t now = g_cpu_allocated.fetch_add(int64_t(nbytes)) + int64_t(nbytes);
    int64_t peak = g_cpu_peak.load();
    while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now)) {
    }
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    g_cpu_allocated.fetch_sub(int64_t(nbytes));
    std::free(ptr);
  }
};

}  // namespace

Allocator& allocator_for(Device device) {
  static CpuAllocator cpu;
  RG_CHECK(device.is_cpu(), "no allocator for device ", device.str(),
           ": the CUDA runtime is not implemented yet");
  return cpu;
}

CpuMemoryStats cpu_memory_stats() { return {g_cpu_allocated.load(), g_cpu_peak.load()}; }
void reset_cpu_peak_bytes() { g_cpu_peak.store(g_cpu_allocated.load()); }

Storage::Storage(size_t nbytes, Device device)
    : data_(allocator_for(device).allocate(nbytes)), nbytes_(nbytes), device_(device) {}

Storage::~Storage() { allocator_for(device_).deallocate(data_, nbytes_); }

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

size_t element_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i64: return 8;
    case DType::i32: return 4;
    case DType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
  }
  return "?";
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

}  // namespace rg
