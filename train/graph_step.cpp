// --cuda-graphs: the training step captured once and replayed (train/graph_step.h).
#include "train/graph_step.h"

#include "engine/cuda/graph.h"
#include "engine/cuda/memory.h"
#include "engine/cuda/stream.h"
#include "engine/cuda/stream_trace.h"
#include "engine/device_checks.h"
#include "kernels/error.h"

namespace rg::train {

struct GraphStep::Captured {
  explicit Captured(Device device) : stream(cuda::pooled_stream(device.index)) {}
  bool matches(const Tensor& in, const Tensor& tg) const {
    return in.shape() == inputs.shape() && in.dtype() == inputs.dtype() &&
           tg.shape() == targets.shape() && tg.dtype() == targets.dtype();
  }

  cuda::Stream stream;  // captured and replayed on it (the legacy default stream cannot be)
  std::unique_ptr<cuda::Graph> graph;
  Tensor inputs, targets, loss;  // static: copied into before each replay; the graph's loss
  std::vector<Tensor> grads;     // the graph's gradients, one per parameter (undefined: none)
  std::vector<DeferredChecks::Captured> checks;
  double lr = 0;
};

GraphStep::GraphStep(optim::Optimizer& optimizer, Device device, int warmup_steps)
    : optimizer_(optimizer), device_(device), warmup_(warmup_steps) {
  RG_CHECK(device.is_cuda(), "--cuda-graphs: CUDA graphs need a CUDA device, got ", device.str());
  RG_CHECK(warmup_steps >= 0, "--cuda-graphs: warm-up steps must be >= 0, got ", warmup_steps);
}

GraphStep::~GraphStep() = default;

void GraphStep::capture(const Body& body, const Tensor& inputs, const Tensor& targets) {
  // The previous graph (another learning rate) goes first, with its pool's memory: its gradients
  // and loss are dropped before it, so the pool's segments return to the device at once.
  optimizer_.zero_grad(/*set_to_none=*/true);
  c_.reset();
  auto c = std::make_unique<Captured>(device_);
  c->inputs = Tensor::empty(inputs.shape(), inputs.dtype(), device_);
  c->targets = Tensor::empty(targets.shape(), targets.dtype(), device_);
  cuda::record_stream(c->inputs, c->stream);
  cuda::record_stream(c->targets, c->stream);
  const cuda::Stream caller = cuda::current_stream(device_.index);
  c->stream.wait(caller);
  DeferredChecks* checks = DeferredChecks::current();
  try {
    const cuda::StreamGuard on(c->stream);
    c->graph = std::make_unique<cuda::Graph>(device_,
                                             [&] { c->loss = body(c->inputs, c->targets); });
  } catch (const Error& e) {
    c->loss = Tensor();
    if (checks) (void)checks->take_captured();
    optimizer_.zero_grad(/*set_to_none=*/true);  // what the failed capture left
    RG_FAIL("--cuda-graphs: the training step cannot be captured as a CUDA graph (", e.what(),
            "); train without --cuda-graphs");
  }
  caller.wait(c->stream);
  if (checks) c->checks = checks->take_captured();
  RG_CHECK(c->loss.defined(), "--cuda-graphs: the captured step returned no loss");
  for (const Tensor& p : optimizer_.params()) c->grads.push_back(p.grad());
  c->lr = optimizer_.lr();
  c_ = std::move(c);
  ++captures_;
}

Tensor GraphStep::run(const Body& body, const Tensor& inputs, const Tensor& targets) {
  if ((!c_ && eager_ < warmup_) || (c_ && !c_->matches(inputs, targets))) {
    ++eager_;  // the caller runs it
    return Tensor();
  }
  // SGD's captured step keeps its learning rate; Adam's replays read the rate of the moment.
  if (!c_ || (!optimizer_.graph_replays_read_lr() && optimizer_.lr() != c_->lr))
    capture(body, inputs, targets);
  Captured& c = *c_;
  c.inputs.copy_(inputs, /*non_blocking=*/true);
  c.targets.copy_(targets, /*non_blocking=*/true);
  // An eager step since the last replay (or zero_grad) took the graph's gradients off the
  // parameters: the replay writes them, so they go back.
  const std::vector<Tensor>& params = optimizer_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (c.grads[i].defined() && !params[i].grad().is_same(c.grads[i]))
      params[i].set_grad(c.grads[i]);
  }
  const cuda::Stream caller = cuda::current_stream(device_.index);
  c.stream.wait(caller);
  {
    const cuda::StreamGuard on(c.stream);
    const cuda::OpSpan span("cuda graph replay", "step", device_);
    c.graph->replay();
  }
  caller.wait(c.stream);
  if (DeferredChecks* checks = DeferredChecks::current())
    for (const DeferredChecks::Captured& check : c.checks) checks->post(check);
  ++replays_;
  return c.loss;
}

}  // namespace rg::train
