// CUDA graphs: the work a callable queues on the current stream of a device, captured once
// (nothing runs while it is captured) and replayed with replay(), each replay one launch instead
// of one per kernel. The first piece of `--cuda-graphs` (issue 32, item 7): the callable must work
// on tensors that exist before the capture and allocate nothing (in-place ops), since the caching
// allocator has no private pool for a graph yet: an allocation inside the capture is an rg::Error
// naming that, and frees inside it are deferred to the capture's end. On the emulator (kernels/emu)
// captures are one stream only.
#pragma once

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
  GraphHandle graph_ = nullptr;
};

namespace detail {
// Whether a Graph is capturing on some thread now (the caching allocator refuses allocations and
// defers frees meanwhile).
bool graph_capture_active();
}  // namespace detail

}  // namespace rg::cuda
