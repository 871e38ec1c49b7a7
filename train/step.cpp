// The training step: schedule, autocast, loss, scaled backward, no_sync, clipping, optimizer.
#include "train/step.h"

#include <optional>

#include "engine/cuda/stream_trace.h"
#include "engine/ops/binary.h"
#include "engine/ops/loss.h"
#include "engine/trace.h"
#include "kernels/error.h"
#include "layers/clip_grad.h"
#include "train/feeder.h"

namespace rg::train {
namespace {

amp::GradScalerOptions scaler_options(const StepOptions& o) {
  RG_CHECK(o.amp == "off" || o.amp == "f16" || o.amp == "bf16",
           "--amp must be off, f16 or bf16, got '", o.amp, "'");
  // f16's narrow range needs loss scaling; bf16 has f32's range and runs without (as PyTorch's
  // recipes). Autocast covers the forward and the loss; parameters and the step stay f32.
  amp::GradScalerOptions s;
  s.enabled = o.amp == "f16";
  return s;
}

}  // namespace

std::pair<Tensor, Tensor> as_rows(const Tensor& logits, const Tensor& targets) {
  if (logits.dim() != 3) return {logits, targets};
  return {logits.view({-1, logits.size(2)}), targets.view({-1})};
}

Step::Step(std::vector<Tensor> params, optim::Optimizer& optimizer, const StepOptions& options,
           Device device)
    : params_(std::move(params)),
      optimizer_(optimizer),
      options_(options),
      device_(device),
      scaler_(scaler_options(options)) {
  RG_CHECK(options.grad_accum_steps >= 1, "--grad-accum-steps must be >= 1");
  if (!options_.loss)
    options_.loss = [](const Tensor& out, const Tensor& t) {
      const auto [logits, targets] = as_rows(out, t);
      return cross_entropy(logits, targets.to(logits.device()));
    };
}

std::unique_ptr<AutocastGuard> Step::autocast() const {
  const bool on = options_.amp != "off";
  return std::make_unique<AutocastGuard>(device_, on ? parse_dtype(options_.amp) : DType::bf16, on);
}

void Step::set_lr(int64_t schedule_step) {
  if (schedule_) optimizer_.set_lr(schedule_->lr_at(schedule_step));
}

Tensor Step::forward_backward(const std::function<Tensor(const Tensor&)>& forward,
                              const data::Batch& batch, bool host_inputs,
                              dist::DistributedDataParallel* ddp, bool sync) {
  std::optional<dist::DistributedDataParallel::NoSync> no_sync;
  if (ddp && !sync) no_sync.emplace(*ddp);
  Tensor loss;
  {
    trace::Scope t("forward", "step");
    const auto amp_scope = autocast();
    const Tensor inputs = host_inputs ? batch.inputs : batch_to_device(batch.inputs, device_);
    const Tensor targets = host_inputs ? batch.targets : batch_to_device(batch.targets, device_);
    const Tensor output = forward(inputs);
    const cuda::OpSpan span("loss", "loss", output.device());  // while tracing: its stream span
    loss = options_.loss(output, targets);
  }
  trace::Scope t("backward", "step");
  const int k = options_.grad_accum_steps;
  scaler_.scale(k > 1 ? loss * (1.0 / double(k)) : loss).backward();
  return loss;
}

// On the accumulated gradients, averaged over ranks (DDP's all-reduce has finished when backward
// returns) and unscaled (as clip_grad_norm_ after scaler.unscale_ in PyTorch).
void Step::optimizer_step() {
  if (options_.clip_grad_norm > 0 || options_.clip_grad_value > 0) {
    trace::Scope t("clip gradients", "step");
    if (scaler_.is_enabled()) scaler_.unscale_(optimizer_);
    if (options_.clip_grad_norm > 0) nn::utils::clip_grad_norm_(params_, options_.clip_grad_norm);
    if (options_.clip_grad_value > 0)
      nn::utils::clip_grad_value_(params_, options_.clip_grad_value);
  }
  trace::Scope t("optimizer step", "step");
  scaler_.step(optimizer_);  // optimizer.step() unless f16 gradients overflowed
  scaler_.update();
}

}  // namespace rg::train
