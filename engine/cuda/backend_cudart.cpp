// The real backend: the CUDA runtime's C API (cudart), every status through RG_CUDA_CHECK.
// Compiled in CUDA builds against cudart, and for rg_engine_emu against the emulated runtime
// (kernels/emu/runtime_api.h), which also receives the allocators' annotations.
#include <cuda_runtime_api.h>

#include <utility>
#include <vector>

#include "engine/cuda/backend.h"
#include "kernels/cuda/check.h"
#include "kernels/error.h"

namespace rg::cuda {
namespace {

cudaStream_t stream_of(StreamHandle s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t event_of(EventHandle e) { return static_cast<cudaEvent_t>(e); }

// Makes `device` current for one call and restores the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    RG_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) {
      RG_CUDA_CHECK(cudaSetDevice(device));
      changed_ = true;
    }
  }
  ~DeviceScope() {
    if (changed_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// Freeing during process exit, after the runtime has shut down, is not an error: the driver
// releases everything then anyway.
void check_release(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaErrorCudartUnloading) {
    (void)cudaGetLastError();
    return;
  }
  detail::check(status, call, file, line);
}
#define RG_CUDA_CHECK_RELEASE(call) check_release((call), #call, __FILE__, __LINE__)

// cudaErrorNotReady is an answer, not a failure (and not sticky, but cleared all the same).
bool check_ready(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  detail::check(status, call, file, line);
  return true;
}
#define RG_CUDA_READY(call) check_ready((call), #call, __FILE__, __LINE__)

class CudartBackend final : public Backend {
 public:
  int device_count() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // the "no driver" error is sticky until read
      return 0;
    }
    return n;
  }
  std::string unavailable_reason() override {
    int n = 0;
    const cudaError_t status = cudaGetDeviceCount(&n);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      return ::rg::detail::cat(
          "no CUDA driver or GPU is usable (cudaGetDeviceCount: ", cudaGetErrorString(status), ")");
    }
    return n == 0 ? "the CUDA driver reports no GPU" : "";
  }
  int current_device() override {
    int d = 0;
    RG_CUDA_CHECK(cudaGetDevice(&d));
    return d;
  }
  void set_device(int device) override { RG_CUDA_CHECK(cudaSetDevice(device)); }
  void synchronize_device(int device) override {
    DeviceScope scope(device);
    RG_CUDA_CHECK(cudaDeviceSynchronize());
  }

  void* malloc_device(int device, size_t nbytes) override {
    DeviceScope scope(device);
    void* p = nullptr;
    // Relaxed for this call: a CUDA graph's private pool (caching_allocator.h) grows during its
    // capture; the segment is not part of the graph and outlives each replay.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    RG_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    const cudaError_t status = cudaMalloc(&p, nbytes);
    RG_CUDA_CHECK_RELEASE(cudaThreadExchangeStreamCaptureMode(&mode));
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    RG_CUDA_CHECK(status);
    return p;
  }
  void free_device(int device, void* ptr) override {
    DeviceScope scope(device);
    RG_CUDA_CHECK_RELEASE(cudaFree(ptr));
  }
  void* malloc_host(size_t nbytes) override {
    void* p = nullptr;
    // Relaxed for this call, as malloc_device: pinning a block during a capture is not part of
    // the graph. Portable: usable by every device's copies, not only the current one's.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    RG_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    const cudaError_t status = cudaHostAlloc(&p, nbytes, cudaHostAllocPortable);
    RG_CUDA_CHECK_RELEASE(cudaThreadExchangeStreamCaptureMode(&mode));
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    RG_CUDA_CHECK(status);
    return p;
  }
  void free_host(void* ptr) override { RG_CUDA_CHECK_RELEASE(cudaFreeHost(ptr)); }
  void copy_async(void* dst, const void* src, size_t nbytes, int device,
                  StreamHandle stream) override {
    DeviceScope scope(device);
    RG_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream_of(stream)));
  }
  void memset_async(void* dst, int byte, size_t nbytes, int device, StreamHandle stream) override {
    DeviceScope scope(device);
    RG_CUDA_CHECK(cudaMemsetAsync(dst, byte, nbytes, stream_of(stream)));
  }

  StreamHandle create_stream(int device) override {
    DeviceScope scope(device);
    cudaStream_t s = nullptr;
    RG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }
  bool query_stream(int device, StreamHandle stream) override {
    DeviceScope scope(device);
    return RG_CUDA_READY(cudaStreamQuery(stream_of(stream)));
  }
  void synchronize_stream(int device, StreamHandle stream) override {
    DeviceScope scope(device);
    RG_CUDA_CHECK(cudaStreamSynchronize(stream_of(stream)));
  }

  EventHandle create_event(int device, bool enable_timing) override {
    DeviceScope scope(device);
    cudaEvent_t e = nullptr;
    RG_CUDA_CHECK(
        cudaEventCreateWithFlags(&e, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
    return e;
  }
  void destroy_event(int device, EventHandle event) override {
    DeviceScope scope(device);
    RG_CUDA_CHECK_RELEASE(cudaEventDestroy(event_of(event)));
  }
  void record_event(int device, EventHandle event, StreamHandle stream) override {
    DeviceScope scope(device);
    RG_CUDA_CHECK(cudaEventRecord(event_of(event), stream_of(stream)));
  }
  void wait_event(int device, StreamHandle stream, EventHandle event) override {
    DeviceScope scope(device);
    RG_CUDA_CHECK(cudaStreamWaitEvent(stream_of(stream), event_of(event), 0));
  }
  void begin_capture(int device, StreamHandle stream) override {
    DeviceScope scope(device);
    RG_CUDA_CHECK(cudaStreamBeginCapture(stream_of(stream), cudaStreamCaptureModeThreadLocal));
  }
  GraphHandle end_capture(int device, StreamHandle stream) override {
    DeviceScope scope(device);
    cudaGraph_t graph = nullptr;
    RG_CUDA_CHECK(cudaStreamEndCapture(stream_of(stream), &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    RG_CUDA_CHECK_RELEASE(cudaGraphDestroy(graph));  // the executable keeps what it needs
    RG_CUDA_CHECK(e);
    return exec;
  }
  void launch_graph(int device, GraphHandle graph, StreamHandle stream) override {
    DeviceScope scope(device);
    RG_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), stream_of(stream)));
  }
  bool stream_capturing(int device, StreamHandle stream) override {
    DeviceScope scope(device);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    RG_CUDA_CHECK(cudaStreamIsCapturing(stream_of(stream), &status));
    return status != cudaStreamCaptureStatusNone;
  }
  void destroy_graph(int device, GraphHandle graph) override {
    DeviceScope scope(device);
    RG_CUDA_CHECK_RELEASE(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph)));
  }
  bool query_event(int device, EventHandle event) override {
    DeviceScope scope(device);
    return RG_CUDA_READY(cudaEventQuery(event_of(event)));
  }
  void synchronize_event(int device, EventHandle event) override {
    DeviceScope scope(device);
    RG_CUDA_CHECK(cudaEventSynchronize(event_of(event)));
  }
  float elapsed_ms(int device, EventHandle start, EventHandle end) override {
    DeviceScope scope(device);
    float ms = 0;
    RG_CUDA_CHECK(cudaEventElapsedTime(&ms, event_of(start), event_of(end)));
    return ms;
  }

#if defined(RG_CUDA_EMU)
  void annotate_block_allocated(int device, void* ptr, size_t bytes, StreamHandle stream) override {
    ::rg::emu::annotate_block_allocated(device, ptr, bytes, stream_of(stream));
  }
  void annotate_block_freed(int device, void* ptr, size_t bytes, StreamHandle stream,
                            const std::vector<StreamHandle>& also_used_on) override {
    std::vector<cudaStream_t> others;
    for (StreamHandle s : also_used_on) others.push_back(stream_of(s));
    ::rg::emu::annotate_block_freed(device, ptr, bytes, stream_of(stream), others);
  }
  void annotate_host_block_allocated(void* ptr, size_t bytes) override {
    ::rg::emu::annotate_host_block_allocated(ptr, bytes);
  }
  void annotate_block_released(void* ptr, size_t bytes) override {
    ::rg::emu::annotate_block_released(ptr, bytes);
  }
  bool poll_event(int device, EventHandle event) override {
    DeviceScope scope(device);
    return RG_CUDA_READY(::rg::emu::poll_event(event_of(event)));
  }
  int64_t host_blocking_calls() override { return int64_t(::rg::emu::host_blocking_calls()); }
  int64_t host_submissions() override { return int64_t(::rg::emu::host_submissions()); }
  bool emulated() const override { return true; }
  void set_host_blocking_observer(void (*observer)(const char* call)) override {
    ::rg::emu::set_host_blocking_observer(observer);
  }
  void set_library_object_observer(void (*observer)(const char* function)) override {
    ::rg::emu::set_library_object_observer(observer);
  }
  void annotate_host_block_freed(
      void* ptr, size_t bytes,
      const std::vector<std::pair<int, StreamHandle>>& also_used_on) override {
    std::vector<std::pair<int, cudaStream_t>> others;
    for (const auto& [d, s] : also_used_on) others.emplace_back(d, stream_of(s));
    ::rg::emu::annotate_host_block_freed(ptr, bytes, others);
  }
#endif
};

}  // namespace

Backend& system_backend() {
  // Never destroyed: memory may be freed after main() returns.
  static CudartBackend* backend = new CudartBackend();
  return *backend;
}

}  // namespace rg::cuda
