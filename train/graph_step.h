// --cuda-graphs: a whole training step (forward, loss, backward, optimizer step) captured once as
// a CUDA graph (engine/cuda/graph.h) and replayed for each later batch of the same shape: one
// launch per step instead of hundreds, so the host's launch costs leave the step's time.
//
// How it works (PyTorch's whole-network capture, made automatic):
//   - Every step runs on a stream of the GraphStep's own (the legacy default stream cannot be
//     captured), ordered after the caller's current stream and the caller's after it.
//   - The first warmup_steps (>= 1) steps run eagerly: the optimizer's state, the cuDNN
//     descriptors and the cuBLAS/cuDNN handles of that stream are created outside any capture (an
//     optimizer's first step inside a capture is refused: it would repeat at every replay).
//   - Then the gradients are set to none, and the step's body runs once on static input and target
//     buffers as a capture: its allocations come from the graph's private pool (the gradients, the
//     loss and every activation keep their addresses), the checks its ops post (DeferredChecks)
//     are kept to post again after each replay.
//   - Each step: the batch is copied into the static buffers and the graph replays; the static
//     loss is returned. Nothing of the body's host code runs again, except what the ops left to
//     run at each replay (cuda::Graph::on_replay): the random ops' Philox offsets, the optimizer's
//     learning rate (a schedule needs no new capture) and Adam's step counts.
//   - A batch of another shape (an epoch's short last batch) runs eagerly; the next replay puts
//     the graph's gradients back on the parameters. With full_batch set, only batches of that many
//     samples are captured (a short first batch after the warm-up is not).
//   - The graph updates the buffers it captured: after the optimizer's load_state (new state
//     tensors) or a parameter given new storage, the capture is dropped, one step runs eagerly
//     (the optimizer may have no state left) and the next is captured again.
// What cannot be captured is refused with an rg::Error naming it (a host-blocking call).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/tensor.h"
#include "layers/optim/optimizer.h"

namespace rg::train {

class GraphStep {
 public:
  // One step on the batch (inputs and targets on the device): forward, loss, backward and the
  // optimizer step; returns the loss. It must not zero the gradients itself.
  using Body = std::function<Tensor(const Tensor& inputs, const Tensor& targets)>;

  // Refuses (rg::Error) a device that is not CUDA and warmup_steps < 1. The optimizer must outlive
  // the GraphStep.
  // full_batch > 0: only batches of that many samples are captured.
  GraphStep(optim::Optimizer& optimizer, Device device, int warmup_steps = 2,
            int64_t full_batch = 0);
  ~GraphStep();
  GraphStep(const GraphStep&) = delete;
  GraphStep& operator=(const GraphStep&) = delete;

  // The step of this batch (inputs and targets on the device): a replay of the graph (captured
  // first when needed), or the body run eagerly (a warm-up step, a batch of another shape than the
  // captured one, or `replayable` false); returns its loss. Under DDP every rank must make the same
  // choice (NCCL requires a collective to be captured on all ranks or on none): the caller passes
  // `replayable` false where the ranks' batches may differ in shape.
  Tensor run(const Body& body, const Tensor& inputs, const Tensor& targets, bool replayable = true);

  // Something else the captured step depends on (DDP's reducer, f16's GradScaler): the next step is
  // captured only when `ready()` says so (it runs eagerly otherwise; `ready` runs on the step's
  // stream and may do host work that no capture could), and a capture is dropped when `version()`
  // changes.
  void add_dependency(std::function<bool()> ready, std::function<uint64_t()> version);

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  int64_t eager_steps() const { return eager_; }

 private:
  struct Captured;  // the graph, its static buffers and outputs (graph_step.cpp)
  struct Lane;      // the stream every step runs on
  void capture(const Body& body, const Tensor& inputs, const Tensor& targets);
  // Whether the capture still updates the optimizer's state and the parameters' storage.
  bool current() const;

  optim::Optimizer& optimizer_;
  Device device_;
  int64_t full_batch_;
  int64_t eager_needed_;  // eager steps before the next capture (warm-up, and after a stale one)
  std::unique_ptr<Lane> lane_;
  std::unique_ptr<Captured> c_;
  struct Dependency {
    std::function<bool()> ready;
    std::function<uint64_t()> version;
  };
  std::vector<Dependency> deps_;
  int64_t captures_ = 0, replays_ = 0, eager_ = 0;
};

}  // namespace rg::train
