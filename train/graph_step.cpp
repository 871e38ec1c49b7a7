// --cuda-graphs: the training step captured once and replayed (train/graph_step.h).
#include "train/graph_step.h"

#include "engine/cuda/graph.h"
#include "engine/cuda/memory.h"
#include "engine/cuda/stream.h"
#include "engine/cuda/stream_trace.h"
#include "engine/device_checks.h"
#include "engine/trace.h"
#include "kernels/error.h"

namespace rg::train {

struct GraphStep::Lane {
  explicit Lane(Device device) : stream(cuda::pooled_stream(device.index)) {}
  cuda::Stream stream;
};

struct GraphStep::Captured {
  bool matches(const Tensor& in, const Tensor& tg) const {
    return in.shape() == inputs.shape() && in.dtype() == inputs.dtype() &&
           tg.shape() == targets.shape() && tg.dtype() == targets.dtype();
  }

  std::unique_ptr<cuda::Graph> graph;
  uint64_t state_version = 0;           // the optimizer's at the capture
  std::vector<const void*> param_data;  // the parameters' storage at the capture
  Tensor inputs, targets, loss;         // static: copied into before each replay; the graph's loss
  std::vector<Tensor> grads;  // the graph's gradients, one per parameter (undefined: none)
  std::vector<DeferredChecks::Captured> checks;
  std::vector<uint64_t> versions;  // the dependencies' at the capture
};

namespace {

// Runs `f` on `lane`, ordered after the caller's current stream and the caller's after it; the
// batch's tensors are kept from reuse until the lane is done with them.
template <class F>
auto on_lane(const cuda::Stream& lane, Device device, const Tensor& inputs, const Tensor& targets,
             F&& f) {
  const cuda::Stream caller = cuda::current_stream(device.index);
  lane.wait(caller);
  for (const Tensor* t : {&inputs, &targets})
    if (t->device().is_cuda()) cuda::record_stream(*t, lane);
  struct Rejoin {
    const cuda::Stream& caller;
    const cuda::Stream& lane;
    ~Rejoin() {
      try {
        caller.wait(lane);
      } catch (...) {  // a sticky CUDA error: the failure that got here is reported instead
      }
    }
  } rejoin{caller, lane};
  const cuda::StreamGuard on(lane);
  return f();
}

}  // namespace

GraphStep::GraphStep(optim::Optimizer& optimizer, Device device, int warmup_steps,
                     int64_t full_batch)
    : optimizer_(optimizer), device_(device), full_batch_(full_batch), eager_needed_(warmup_steps) {
  RG_CHECK(device.is_cuda(), "--cuda-graphs: CUDA graphs need a CUDA device, got ", device.str());
  // At least one eager step on the lane: cuBLAS and cuDNN create their handles for a stream at its
  // first use (device memory, which a capture cannot allocate), the optimizer its state.
  RG_CHECK(warmup_steps >= 1, "--cuda-graphs: at least one warm-up step, got ", warmup_steps);
  lane_ = std::make_unique<Lane>(device);
}

GraphStep::~GraphStep() = default;

void GraphStep::add_dependency(std::function<bool()> ready, std::function<uint64_t()> version) {
  RG_CHECK(captures_ == 0, "GraphStep::add_dependency after the first capture");
  deps_.push_back({std::move(ready), std::move(version)});
}

// On the lane (run's on_lane).
void GraphStep::capture(const Body& body, const Tensor& inputs, const Tensor& targets) {
  optimizer_.zero_grad(/*set_to_none=*/true);
  auto c = std::make_unique<Captured>();
  c->inputs = Tensor::empty(inputs.shape(), inputs.dtype(), device_, inputs.memory_format());
  c->targets = Tensor::empty(targets.shape(), targets.dtype(), device_, targets.memory_format());
  DeferredChecks* checks = DeferredChecks::current();
  try {
    c->graph =
        std::make_unique<cuda::Graph>(device_, [&] { c->loss = body(c->inputs, c->targets); });
  } catch (const Error& e) {
    c->loss = Tensor();
    if (checks) (void)checks->take_captured();
    optimizer_.zero_grad(/*set_to_none=*/true);  // what the failed capture left
    RG_FAIL("--cuda-graphs: the training step cannot be captured as a CUDA graph (", e.what(),
            "); train without --cuda-graphs");
  }
  if (checks) c->checks = checks->take_captured();
  RG_CHECK(c->loss.defined(), "--cuda-graphs: the captured step returned no loss");
  for (const Tensor& p : optimizer_.params()) {
    c->grads.push_back(p.grad());
    c->param_data.push_back(p.raw_data());
  }
  c->state_version = optimizer_.state_version();
  for (const Dependency& d : deps_) c->versions.push_back(d.version());
  c_ = std::move(c);
  ++captures_;
}

bool GraphStep::current() const {
  if (optimizer_.state_version() != c_->state_version) return false;
  for (size_t i = 0; i < deps_.size(); ++i)
    if (deps_[i].version() != c_->versions[i]) return false;
  const std::vector<Tensor>& params = optimizer_.params();
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].raw_data() != c_->param_data[i]) return false;
  return true;
}

Tensor GraphStep::run(const Body& body, const Tensor& inputs, const Tensor& targets,
                      bool replayable) {
  if (c_ && !current()) {
    c_.reset();  // the graph's pool goes back once the streams it ran on are done with it
    eager_needed_ = eager_ + 1;
  }
  const bool full = full_batch_ <= 0 || (inputs.dim() > 0 && inputs.size(0) == full_batch_);
  bool eager =
      !replayable || (c_ ? !c_->matches(inputs, targets) : (eager_ < eager_needed_ || !full));
  const cuda::Stream caller = cuda::current_stream(device_.index);
  const Tensor loss = on_lane(lane_->stream, device_, inputs, targets, [&] {
    if (!eager && !c_)
      for (const Dependency& d : deps_)
        if (!d.ready()) {
          eager = true;
          break;
        }
    if (eager) {
      ++eager_;
      return body(inputs, targets);
    }
    // On the host's lane: a replayed step's own span (its body's forward span ran only at the
    // capture), where the trace's step detection starts the step (apps/trace_file.h).
    const trace::Scope step_span(c_ ? "cuda graph replay" : "cuda graph capture", "step");
    if (!c_) capture(body, inputs, targets);
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
    {
      const cuda::OpSpan span("cuda graph replay", "step", device_);
      c.graph->replay();
    }
    if (DeferredChecks* checks = DeferredChecks::current())
      for (const DeferredChecks::Captured& check : c.checks) checks->post(check);
    ++replays_;
    return c.loss;
  });
  // What the lane made and the caller may use (the loss it reads back; an eager step's gradients)
  // is reused only after the caller's work queued so far.
  cuda::record_stream(loss, caller);
  if (eager)
    for (const Tensor& p : optimizer_.params())
      if (const Tensor g = p.grad(); g.defined()) cuda::record_stream(g, caller);
  return loss;
}

}  // namespace rg::train
