// The few CUDA runtime calls the engine's CUDA runtime is built on, behind an interface: the real
// one (cudart) exists only in CUDA builds, and tests drive the runtime with a fake one on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rg::cuda {

// cudaStream_t / cudaEvent_t in the real backend. A null StreamHandle is the device's legacy
// default stream.
using StreamHandle = void*;
using EventHandle = void*;
using GraphHandle = void*;  // cudaGraphExec_t in the real backend

// Every call names the device it concerns; the backend makes it current for the call and restores
// the caller's device afterwards. Failures throw rg::Error, except running out of memory.
class Backend {
 public:
  virtual ~Backend() = default;

  // 0 without a driver or GPU (never throws); why, for error messages.
  virtual int device_count() = 0;
  virtual std::string unavailable_reason() = 0;
  virtual int current_device() = 0;
  virtual void set_device(int device) = 0;
  virtual void synchronize_device(int device) = 0;

  // Device memory; nullptr when the device is out of memory.
  virtual void* malloc_device(int device, size_t nbytes) = 0;
  virtual void free_device(int device, void* ptr) = 0;
  // Page-locked host memory usable by every device; nullptr when none is left.
  virtual void* malloc_host(size_t nbytes) = 0;
  virtual void free_host(void* ptr) = 0;
  // Any direction (unified addressing), ordered on `stream` of `device`.
  virtual void copy_async(void* dst, const void* src, size_t nbytes, int device,
                          StreamHandle stream) = 0;
  virtual void memset_async(void* dst, int byte, size_t nbytes, int device,
                            StreamHandle stream) = 0;

  // A new stream that does not synchronize with the legacy default stream.
  virtual StreamHandle create_stream(int device) = 0;
  virtual bool query_stream(int device, StreamHandle stream) = 0;  // true: all work done
  virtual void synchronize_stream(int device, StreamHandle stream) = 0;

  virtual EventHandle create_event(int device, bool enable_timing) = 0;
  virtual void destroy_event(int device, EventHandle event) = 0;
  virtual void record_event(int device, EventHandle event, StreamHandle stream) = 0;
  // Work submitted to `stream` (on `device`) later waits for `event`, without blocking the host.
  virtual void wait_event(int device, StreamHandle stream, EventHandle event) = 0;
  virtual bool query_event(int device, EventHandle event) = 0;  // true: reached
  // query_event for bookkeeping polls (the allocators' pending frees, the NCCL watchdog): on a
  // GPU the same; under the emulator's race detector a reached event does not order the host's
  // later work after it, so such a poll cannot hide a missing wait in the program's own work.
  virtual bool poll_event(int device, EventHandle event) { return query_event(device, event); }
  virtual void synchronize_event(int device, EventHandle event) = 0;
  virtual float elapsed_ms(int device, EventHandle start, EventHandle end) = 0;

  // CUDA graphs (engine/cuda/graph.h): begin_capture makes `stream` record the work queued on it
  // instead of running it (thread-local mode: this thread's unsafe calls, such as cudaMalloc,
  // fail the capture meanwhile); end_capture ends the capture and returns the instantiated graph,
  // or throws rg::Error with CUDA's reason when the capture failed; launch_graph queues a graph's
  // work on a stream; destroy_graph frees it. Backends without graphs refuse (rg::Error).
  virtual void begin_capture(int device, StreamHandle stream);
  virtual GraphHandle end_capture(int device, StreamHandle stream);
  virtual void launch_graph(int device, GraphHandle graph, StreamHandle stream);
  virtual void destroy_graph(int device, GraphHandle graph);
  // Whether `stream` is capturing now (cudaStreamIsCapturing: it began a capture, or joined one
  // through an event); false for backends without graphs.
  virtual bool stream_capturing(int device, StreamHandle stream);

  // What the caching allocators know about their blocks, for the emulator's stream-race detector
  // (no-ops on a real GPU): a device block handed out for work on `stream` and taken back, with
  // the other streams that record_stream named; the same for pinned host blocks.
  virtual void annotate_block_allocated(int /*device*/, void* /*ptr*/, size_t /*bytes*/,
                                        StreamHandle /*stream*/) {}
  virtual void annotate_block_freed(int /*device*/, void* /*ptr*/, size_t /*bytes*/,
                                    StreamHandle /*stream*/,
                                    const std::vector<StreamHandle>& /*also_used_on*/) {}
  virtual void annotate_host_block_allocated(void* /*ptr*/, size_t /*bytes*/) {}
  // A pending free (device or pinned) whose events poll_event found reached.
  virtual void annotate_block_released(void* /*ptr*/, size_t /*bytes*/) {}
  virtual void annotate_host_block_freed(
      void* /*ptr*/, size_t /*bytes*/,
      const std::vector<std::pair<int, StreamHandle>>& /*also_used_on*/) {}

  // Host-blocking calls (synchronizations, pageable copies, device-to-host reads) of the calling
  // thread so far, -1 where the backend does not count them (only the emulator does: a real
  // runtime's own calls, cuBLAS's and cuDNN's included, cannot be seen from here). The observer
  // hears each one by name, on the blocking thread (the runtime installs the tracer's).
  virtual int64_t host_blocking_calls() { return -1; }
  // Work the calling thread queued on streams (launches, asynchronous copies and sets; a graph
  // launch once), -1 where not counted (only the emulator counts).
  virtual int64_t host_submissions() { return -1; }
  // True for the CPU emulation of kernels/emu/ (whose cuBLAS and cuDNN always take TF32 when it
  // is allowed; a real library may choose an algorithm that does not).
  virtual bool emulated() const { return false; }
  virtual void set_host_blocking_observer(void (* /*observer*/)(const char* call)) {}
  // The observer hears each host-side library object (a cuDNN descriptor) created, by the
  // creating function's name; only the emulator reports them (its cuDNN's descriptors).
  virtual void set_library_object_observer(void (* /*observer*/)(const char* function)) {}
};

// The process's real backend: cudart in CUDA builds; in builds without CUDA one that reports 0
// devices and throws "built without CUDA" for everything else.
Backend& system_backend();

}  // namespace rg::cuda
