// CUDA streams: a value naming one stream of one device, and each thread's current stream per
// device, which the engine's CUDA work (kernels, copies, allocations) is queued on.
//
// The current stream starts as the device's legacy default stream (as in PyTorch): work queued by
// code that knows nothing of our streams (cuBLAS without a stream, cudaMemcpy) stays ordered with
// ours. Streams from pooled_stream() are non-blocking, so work on them (NCCL's, a data loader's
// copies) overlaps with the default stream; order across streams with Event or Stream::wait.
// The current stream is per thread: a communication or loader thread changing it does not move
// the main thread's work.
#pragma once

#include <string>

#include "engine/cuda/backend.h"
#include "engine/device.h"

namespace rg::cuda {

class Event;

class Stream {
 public:
  Stream(int device, StreamHandle handle) : device_(device), handle_(handle) {}

  int device_index() const { return device_; }
  Device device() const { return Device::cuda(device_); }
  // The cudaStream_t, for kernel launchers (kernels/cuda take it as void*).
  StreamHandle handle() const { return handle_; }
  bool is_default() const { return handle_ == nullptr; }

  bool query() const;        // true when all work queued so far is done
  void synchronize() const;  // blocks the host until then
  // Work queued on this stream from now on waits until `event` is reached (host not blocked).
  void wait(const Event& event) const;
  // Work queued on this stream from now on waits for the work queued on `other` so far.
  void wait(const Stream& other) const;

  bool operator==(const Stream&) const = default;
  std::string str() const;  // "cuda:0/default", "cuda:1/0x55d0c1e0"

 private:
  int device_;
  StreamHandle handle_;
};

// device -1: the current device. All throw rg::Error without a CUDA device.
Stream default_stream(int device = -1);
Stream current_stream(int device = -1);
// One of Runtime::kStreamPoolSize non-blocking streams of the device, round-robin (never
// destroyed, so handing one out costs nothing after the first round).
Stream pooled_stream(int device = -1);
void set_current_stream(const Stream& stream);

// Makes `stream` the current stream of its device and that device the current device; restores
// both when destroyed.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_stream_;
  int previous_device_;
};

}  // namespace rg::cuda
