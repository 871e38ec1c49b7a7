// The backend of rg_engine_emu: emulated CUDA devices whose memory is host memory, for running the
// engine's CUDA code paths on the emulated kernels (kernels/emu) where there is no GPU.
//
// The emulator runs every kernel launch to completion before the launch returns, so all "device"
// work is synchronous: streams and events are always complete, and waits are no-ops. Events record
// the host clock, so elapsed_ms measures the host time between two records. RG_EMU_DEVICES sets
// the number of devices (default 1).
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_set>

#include "engine/cuda/backend.h"
#include "kernels/error.h"

namespace rg::cuda {
namespace {

struct EmulatedEvent {
  int device;
  std::chrono::steady_clock::time_point recorded{};
};

class EmulatedBackend final : public Backend {
 public:
  EmulatedBackend() {
    if (const char* env = std::getenv("RG_EMU_DEVICES"); env != nullptr && *env != '\0') {
      char* end = nullptr;
      const long n = std::strtol(env, &end, 10);
      RG_CHECK(end != env && *end == '\0' && n >= 0 && n <= 16,
               "RG_EMU_DEVICES must be a number of emulated devices in [0, 16], got '", env, "'");
      devices_ = int(n);
    }
  }

  int device_count() override { return devices_; }
  std::string unavailable_reason() override { return "RG_EMU_DEVICES is 0"; }
  int current_device() override { return current_; }
  void set_device(int device) override {
    check(device, "set_device");
    current_ = device;
  }
  void synchronize_device(int device) override { check(device, "synchronize_device"); }

  void* malloc_device(int device, size_t nbytes) override {
    check(device, "malloc_device");
    // 256-byte alignment, as cudaMalloc's.
    return ::operator new(nbytes == 0 ? 1 : nbytes, std::align_val_t(256), std::nothrow);
  }
  void free_device(int device, void* ptr) override {
    check(device, "free_device");
    ::operator delete(ptr, std::align_val_t(256));
  }
  void* malloc_host(size_t nbytes) override {
    return ::operator new(nbytes == 0 ? 1 : nbytes, std::align_val_t(4096), std::nothrow);
  }
  void free_host(void* ptr) override { ::operator delete(ptr, std::align_val_t(4096)); }
  void copy_async(void* dst, const void* src, size_t nbytes, int device, StreamHandle) override {
    check(device, "copy_async");
    if (nbytes != 0) std::memmove(dst, src, nbytes);
  }
  void memset_async(void* dst, int byte, size_t nbytes, int device, StreamHandle) override {
    check(device, "memset_async");
    if (nbytes != 0) std::memset(dst, byte, nbytes);
  }

  // Distinct non-null handles; the emulator ignores the stream of a launch.
  StreamHandle create_stream(int device) override {
    check(device, "create_stream");
    std::lock_guard<std::mutex> lock(mu_);
    return reinterpret_cast<StreamHandle>(++next_stream_);
  }
  bool query_stream(int, StreamHandle) override { return true; }
  void synchronize_stream(int device, StreamHandle) override {
    check(device, "synchronize_stream");
  }

  EventHandle create_event(int device, bool) override {
    check(device, "create_event");
    auto* e = new EmulatedEvent{device};
    std::lock_guard<std::mutex> lock(mu_);
    events_.insert(e);
    return e;
  }
  void destroy_event(int, EventHandle event) override {
    std::lock_guard<std::mutex> lock(mu_);
    RG_CHECK(events_.erase(static_cast<EmulatedEvent*>(event)) == 1,
             "emulated destroy_event of an unknown event");
    delete static_cast<EmulatedEvent*>(event);
  }
  void record_event(int, EventHandle event, StreamHandle) override {
    static_cast<EmulatedEvent*>(event)->recorded = std::chrono::steady_clock::now();
  }
  void wait_event(int, StreamHandle, EventHandle) override {}
  bool query_event(int, EventHandle) override { return true; }
  void synchronize_event(int, EventHandle) override {}
  float elapsed_ms(int, EventHandle start, EventHandle end) override {
    const auto d =
        static_cast<EmulatedEvent*>(end)->recorded - static_cast<EmulatedEvent*>(start)->recorded;
    return std::chrono::duration<float, std::milli>(d).count();
  }

 private:
  void check(int device, const char* call) const {
    RG_CHECK(device >= 0 && device < devices_, "emulated ", call, ": device ", device,
             " does not exist (", devices_, " emulated devices)");
  }

  int devices_ = 1;
  int current_ = 0;
  std::mutex mu_;
  uintptr_t next_stream_ = 0;
  std::unordered_set<EmulatedEvent*> events_;
};

}  // namespace

Backend& system_backend() {
  static EmulatedBackend backend;
  return backend;
}

}  // namespace rg::cuda
