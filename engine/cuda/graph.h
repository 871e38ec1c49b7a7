// CUDA graphs: the work a callable queues on the current stream of a device, captured once
// (nothing runs while it is captured) and replayed with replay(), each replay one launch instead
// of one per kernel. What the callable allocates comes from the graph's private pool of the
// caching allocator (engine/cuda/caching_allocator.h): tensors it returns or leaves behind (a
// loss, the gradients) keep their memory, and each replay writes the same addresses, so they are
// the graph's static outputs; its inputs are tensors made before the capture, refilled in place
// before each replay. A tensor the callable frees that was made before the capture stays reserved
// until the graph is destroyed, and so does pinned host memory that a captured copy reads or
// writes (engine/cuda/pinned_allocator.h), whenever it is freed. Host code in the callable runs
// once, at capture: host values that change per step reach the replays only through replay slots
// written by on_replay hooks (random ops' offsets, the optimizers' learning rates and Adam's
// host-counted steps do); host-blocking calls fail the capture. Other streams may join the capture
// through events (ProcessGroupNCCL's stream does), and must be joined back before it ends
// (kernels/emu emulates both).
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

  // Queues the captured work on the device's current stream (after the replay hooks: see
  // philox_offset and on_replay).
  void replay();

  // For ops whose kernels take host values that change from one replay to the next (a random
  // op's Philox offset, Adam's bias corrections and learning rate): the Graph capturing on this
  // thread (null outside a capture); `replay_slots(n)` reserves n 8-byte slots of device memory
  // allocated before the capture (kReplaySlots in all: a block carved from the graph's pool
  // could be one the captured work used before, which a replay would overwrite afterwards) for
  // the kernels to read; `on_replay(hook)` runs `hook` at each replay, in registration order,
  // before the graph's work, to write them (on the current stream, without blocking the host).
  static Graph* capturing();
  // The Graph whose capture `device`'s current stream belongs to now (it began it, or joined it
  // through an event), or null when that stream is not captured, whatever capturing() says.
  // Throws rg::Error when the stream is captured by something other than a cuda::Graph of this
  // thread and device (a raw cudaStreamBeginCapture, or a Graph of another thread whose capture
  // the stream joined; the message says which): work that registers replay hooks (a captured
  // collective, DDP's status) would be replayed without them.
  static Graph* capturing(int device);
  Tensor replay_slots(int64_t n);
  void on_replay(std::function<void()> hook);
  // For what the host must do after each replay's work is queued (DDP reads a replay's status,
  // a process group watches its collectives): `hook` runs after each launch, in registration
  // order, with the device's current stream the one the replay was queued on.
  void after_replay(std::function<void()> hook);
  int device() const { return device_; }
  uint64_t id() const { return id_; }  // unique in the process
  static constexpr int64_t kReplaySlots = 4096;

 private:
  friend philox::Offset philox_offset(Generator& gen, uint64_t groups, Device device);
  // A generator the captured random ops drew from: where its offset was at the capture, how many
  // counters one replay takes, and its replay slot (the number its kernels add to their offsets).
  struct Rng {
    Generator* gen;
    uint64_t seed, start, count;
    Tensor slot;
  };

  int device_ = 0;
  uint64_t id_ = 0;
  uint64_t pool_ = 0;  // the caching allocator's private pool for it
  GraphHandle graph_ = nullptr;
  std::vector<Rng> rng_;
  Tensor slots_;  // kReplaySlots i64, allocated before the capture
  int64_t slots_used_ = 0;
  std::vector<std::function<void()>> hooks_, after_hooks_;
  std::vector<StreamHandle> replayed_on_;  // the streams of its launches
};

// The first Philox counter of a random op on `device` that takes `groups` counters from `gen`
// (what gen.reserve(groups) returns, outside a capture). Inside a capture on this thread (PyTorch's
// graph-safe generators): an offset relative to where `gen` was at the capture plus a number in
// device memory that each replay sets to gen's offset then, advancing gen by what one replay
// takes; so replays draw what the same eager steps would, and the capture itself draws nothing
// (gen is rewound at its end). `gen` must outlive the graph and keep its seed.
philox::Offset philox_offset(Generator& gen, uint64_t groups, Device device);

}  // namespace rg::cuda
