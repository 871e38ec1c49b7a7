// The training step of a Trainer: the learning rate from the schedule, forward and loss under
// autocast, the (GradScaler-scaled) backward of each micro-batch, DDP's no_sync for all but the
// last of an accumulation window, then clipping and the optimizer step on the averaged gradients.
#pragma once

#include <memory>

#include "comm/ddp.h"
#include "data/dataset.h"
#include "engine/autocast.h"
#include "layers/amp/grad_scaler.h"
#include "layers/optim/optimizer.h"
#include "train/options.h"

namespace rg::train {

struct StepOptions {
  int grad_accum_steps = 1;
  double clip_grad_norm = 0, clip_grad_value = 0;
  std::string amp = "off";  // f16 also scales the loss with a dynamic GradScaler
  LossFn loss;              // default: cross-entropy (as_rows of token models)
};

// A token model's [B, T, V] logits and [B, T] targets as [B T, V] rows and [B T] targets (every
// position is a prediction); classifiers' [B, C] and [B] pass through.
std::pair<Tensor, Tensor> as_rows(const Tensor& logits, const Tensor& targets);

class Step {
 public:
  Step(std::vector<Tensor> params, optim::Optimizer& optimizer, const StepOptions& options,
       Device device);
  // The GradScaler when it is on (checkpoints carry its state), else nullptr.
  amp::GradScaler* scaler() { return scaler_.is_enabled() ? &scaler_ : nullptr; }
  // Autocast of --amp (a no-op guard when off), for the forward and the evaluation.
  std::unique_ptr<AutocastGuard> autocast() const;
  void set_schedule(std::shared_ptr<const optim::LrSchedule> schedule) {
    schedule_ = std::move(schedule);
  }
  // The learning rate at the schedule's step (without a schedule: unchanged).
  void set_lr(int64_t schedule_step);
  void zero_grad() { optimizer_.zero_grad(); }
  // One micro-batch: the inputs' copy to the device (unless `host_inputs`), forward (through
  // `forward`, under autocast) and loss, then the backward of the loss divided by the
  // accumulation steps, inside DDP's no_sync unless `sync`. Returns the (undivided) loss.
  Tensor forward_backward(const std::function<Tensor(const Tensor&)>& forward,
                          const data::Batch& batch, bool host_inputs,
                          dist::DistributedDataParallel* ddp, bool sync);
  // Clipping (on unscaled gradients) and the optimizer step through the scaler.
  void optimizer_step();

 private:
  std::vector<Tensor> params_;
  optim::Optimizer& optimizer_;
  StepOptions options_;
  Device device_;
  amp::GradScaler scaler_;
  std::shared_ptr<const optim::LrSchedule> schedule_;
};

}  // namespace rg::train
