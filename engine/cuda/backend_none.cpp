// The backend of builds without CUDA: no devices, and "built without CUDA" for everything else.
#include "engine/cuda/backend.h"
#include "kernels/error.h"

namespace rg::cuda {
namespace {

[[noreturn]] void fail(const char* call) {
  RG_FAIL("no CUDA device: ", call, ": ringgrad was built without CUDA (RG_CUDA=OFF or no nvcc)");
}

class NoCudaBackend final : public Backend {
 public:
  int device_count() override { return 0; }
  std::string unavailable_reason() override {
    return "ringgrad was built without CUDA (RG_CUDA=OFF or no nvcc)";
  }
  int current_device() override { fail("current_device"); }
  void set_device(int) override { fail("set_device"); }
  void synchronize_device(int) override { fail("synchronize_device"); }
  void* malloc_device(int, size_t) override { fail("malloc_device"); }
  void free_device(int, void*) override { fail("free_device"); }
  void* malloc_host(size_t) override { fail("malloc_host"); }
  void free_host(void*) override { fail("free_host"); }
  void copy_async(void*, const void*, size_t, int, StreamHandle) override { fail("copy_async"); }
  void memset_async(void*, int, size_t, int, StreamHandle) override { fail("memset_async"); }
  StreamHandle create_stream(int) override { fail("create_stream"); }
  bool query_stream(int, StreamHandle) override { fail("query_stream"); }
  void synchronize_stream(int, StreamHandle) override { fail("synchronize_stream"); }
  EventHandle create_event(int, bool) override { fail("create_event"); }
  void destroy_event(int, EventHandle) override { fail("destroy_event"); }
  void record_event(int, EventHandle, StreamHandle) override { fail("record_event"); }
  void wait_event(int, StreamHandle, EventHandle) override { fail("wait_event"); }
  bool query_event(int, EventHandle) override { fail("query_event"); }
  void synchronize_event(int, EventHandle) override { fail("synchronize_event"); }
  float elapsed_ms(int, EventHandle, EventHandle) override { fail("elapsed_ms"); }
};

}  // namespace

Backend& system_backend() {
  static NoCudaBackend backend;
  return backend;
}

}  // namespace rg::cuda
