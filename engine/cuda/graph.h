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
#include <vector>

#include "engine/cuda/backend.h"
#include "engine/device.h"
#include "engine/tensor.h"
#include "kernels/philox.h"

namespace rg {
class Generator;
}

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

  // Queues the captured work on the device's current stream (after setting the random ops'
  // offsets: see philox_offset).
  void replay();

 private:
  friend philox::Offset philox_offset(Generator& gen, uint64_t groups, Device device);
  // A generator the captured random ops drew from: where its offset was at the capture, how many
  // counters one replay takes, and its slot in rng_slots_ (the number its kernels add to their
  // offsets).
  struct Rng {
    Generator* gen;
    uint64_t seed, start, count;
    int64_t slot;
  };
  static constexpr int64_t kMaxGenerators = 64;

  int device_ = 0;
  uint64_t pool_ = 0;  // the caching allocator's private pool for it
  GraphHandle graph_ = nullptr;
  std::vector<Rng> rng_;
  // Allocated before the capture: the replays write it before the graph's work, so its memory
  // must not be a block the captured work also used (blocks freed in a capture are reused in it).
  Tensor rng_slots_;
};

// The first Philox counter of a random op on `device` that takes `groups` counters from `gen`
// (what gen.reserve(groups) returns, outside a capture). Inside a capture on this thread (PyTorch's
// graph-safe generators): an offset relative to where `gen` was at the capture plus a number in
// device memory that each replay sets to gen's offset then, advancing gen by what one replay
// takes; so replays draw what the same eager steps would, and the capture itself draws nothing
// (gen is rewound at its end). `gen` must outlive the graph and keep its seed.
philox::Offset philox_offset(Generator& gen, uint64_t groups, Device device);

namespace detail {
// Whether a Graph is capturing on some thread now (trace spans and deferred checks change their
// ways meanwhile).
bool graph_capture_active();
}  // namespace detail

}  // namespace rg::cuda
