// --cuda-graphs: a whole training step (forward, loss, backward, optimizer step) captured once as
// a CUDA graph (engine/cuda/graph.h) and replayed for each later batch of the same shape: one
// launch per step instead of hundreds, so the host's launch costs leave the step's time.
//
// How it works (PyTorch's whole-network capture, made automatic):
//   - The first warmup_steps steps run eagerly (the caller's own code): the optimizer's state, the
//     cuDNN descriptors and the libraries' workspaces are created outside any capture (an
//     optimizer's first step inside a capture is refused: it would repeat at every replay).
//   - Then the gradients are set to none, and the step's body runs once on static input and target
//     buffers, on a stream of its own, as a capture: its allocations come from the graph's private
//     pool (the gradients, the loss and every activation keep their addresses), the checks its ops
//     post (DeferredChecks) are kept to post again after each replay.
//   - Each step: the batch is copied into the static buffers, the graph replays on its stream
//     (ordered after the caller's stream, and the caller's stream after it), and the static loss
//     is returned. Nothing of the body's host code runs again.
//   - A batch of another shape (an epoch's last short batch) runs eagerly; the next replay puts
//     the graph's gradients back on the parameters. SGD's learning rate is a kernel argument: a
//     rate other than the captured one (a schedule) captures again. Adam's step counts, bias
//     corrections and rate are written to the graph's replay slots before each replay, so its
//     replays follow a schedule without capturing again.
// Random ops (dropout) draw new numbers at each replay, the eager steps' (cuda::philox_offset).
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

  // Refuses (rg::Error) a device that is not CUDA. The optimizer must outlive the GraphStep.
  GraphStep(optim::Optimizer& optimizer, Device device, int warmup_steps = 2);
  ~GraphStep();
  GraphStep(const GraphStep&) = delete;
  GraphStep& operator=(const GraphStep&) = delete;

  // The step of this batch through the graph (captured first when needed); an undefined tensor
  // when the caller must run it eagerly (a warm-up step, or a batch of another shape than the
  // captured one). The inputs may be on the host or the device.
  Tensor run(const Body& body, const Tensor& inputs, const Tensor& targets);

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  int64_t eager_steps() const { return eager_; }

 private:
  struct Captured;  // the graph, its stream, static buffers and outputs (graph_step.cpp)
  void capture(const Body& body, const Tensor& inputs, const Tensor& targets);

  optim::Optimizer& optimizer_;
  Device device_;
  int warmup_;
  std::unique_ptr<Captured> c_;
  int64_t captures_ = 0, replays_ = 0, eager_ = 0;
};

}  // namespace rg::train
