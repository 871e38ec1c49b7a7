// CUDA graphs: the work a callable queues on the current stream of a device, captured once
// (nothing runs while it is captured) and replayed with replay(), each replay one launch instead
// of one per kernel. What the callable allocates comes from the graph's private pool of the
// caching allocator (engine/cuda/caching_allocator.h): tensors it returns or leaves behind (a
// loss, the gradients) keep their memory, and each replay writes the same addresses, so they are
// the graph's static outputs; its inputs are tensors made before the capture, refilled in place
// before each replay. A tensor the callable frees that was made before the capture stays reserved
// until the graph is destroyed. Host code in the callable runs once, at capture: nothing that
// reads back, draws random numbers on the host, or depends on host values changing (a learning
// rate, a step count) can be replayed; host-blocking calls fail the capture. On the emulator
// (kernels/emu) captures are one stream only.
#pragma once

#include <cstdint>
#include <functional>

#include "engine/cuda/backend.h"
#include "engine/device.h"

namespace rg::cuda {

class Graph {
 public:
  // Captures what `body` queues on `device`'s current stream, and instantiates it. Throws
  // rg::Error when the capture fails (an allocation, a host-blocking call, another stream's
  // event), after ending the capture: the stream is usable again.
  Graph(Device device, const std::function<void()>& body);
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&&) = delete;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Queues the captured work on the device's current stream.
  void replay() const;

 private:
  int device_ = 0;
  uint64_t pool_ = 0;  // the caching allocator's private pool for it
  GraphHandle graph_ = nullptr;
};

// Random ops on CUDA call this: the Philox offset is a host value, so a captured random op would
// draw the same numbers at every replay; during a capture it is an rg::Error naming `op`.
void refuse_random_in_capture(Device device, const char* op);

namespace detail {
// Whether a Graph is capturing on some thread now (trace spans and deferred checks change their
// ways meanwhile).
bool graph_capture_active();
}  // namespace detail

}  // namespace rg::cuda
