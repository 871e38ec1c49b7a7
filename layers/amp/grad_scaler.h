// Dynamic loss scaling for mixed-precision training, with torch.amp.GradScaler's semantics:
//
//   scaler.scale(loss).backward();  // gradients of loss * scale: small f16 values do not flush
//   scaler.unscale_(opt);           // optional: divide .grad by the scale now (e.g. to clip)
//   scaler.step(opt);               // unscales if not done yet; skips the step on inf/NaN
//   scaler.update();                // on inf/NaN: scale *= backoff_factor, else after
//                                   // growth_interval good steps in a row: scale *= growth_factor
//
// The scale is an f32 value (as PyTorch's f32 scale tensor); a growth that would overflow f32 is
// not applied. Each optimizer moves ready -> unscaled -> stepped once per iteration, and update()
// starts the next iteration; calls out of that order are clear errors, as in PyTorch.
//
// On CUDA (from the first scale() or unscale_() that sees CUDA tensors) the scale, the growth
// tracker, 1/scale and each optimizer's inf/NaN flag live on that one device, as PyTorch's scale
// tensors, and nothing is read back in a step when the optimizer can skip a step on the device
// (optim::Optimizer::can_skip_on_device: SGD once its momentum buffers exist, Adam and AdamW,
// whose step counts then move to the device): step() queues
// optimizer.step_unless(flag) and update() adjusts the scale with a kernel (PyTorch's fused
// optimizers' found_inf and _amp_update_scale_). So a step has no host stall and can be captured
// into a CUDA graph. Otherwise (SGD's first momentum step; Adam with betas too close to 1, whose
// counts stay on the host) unscale_ reads the flag back once, as PyTorch's step() does. get_scale(),
// growth_tracker() and state() read the device values (a wait). One CUDA device per scaler: once
// its scale is there, gradients or losses on the CPU or on another device are clear errors
// (PyTorch keeps a flag per device; a model split over GPUs under one optimizer is refused).
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>

#include "engine/tensor.h"

namespace rg::optim {
class Optimizer;
}

namespace rg::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;  // false: scale() is the identity, step() is optimizer.step()
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale; f16/bf16 losses are scaled in f32 (PyTorch promotes them to the f32 scale), so
  // the scaled loss cannot overflow the half type.
  Tensor scale(const Tensor& loss);
  // Multiplies every gradient of the optimizer's parameters by 1/scale in place and records
  // whether any was inf or NaN. f16 gradients are refused (keep f32 master weights).
  void unscale_(optim::Optimizer& optimizer);
  // Unscales unless unscale_ ran, then calls optimizer.step() unless a gradient was inf or NaN.
  // Returns whether the optimizer stepped; when the device decides (see above) true: the step is
  // queued, and skipped there if a gradient overflowed (the scale's backoff in update() shows it).
  bool step(optim::Optimizer& optimizer);
  // Adjusts the scale from this iteration's inf/NaN checks (at least one step or unscale_ must
  // have run) and starts the next iteration.
  void update();
  // Sets the scale instead (> 0 and finite) and starts the next iteration.
  void update(double new_scale);

  // Whether the last unscale_ of `optimizer` left the skip decision to the device (no read back);
  // train::GraphStep captures an f16 step only then (an SGD warm-up step that overflowed before
  // its momentum buffers existed reads back, and so would the capture).
  bool decides_on_device(const optim::Optimizer& optimizer) const;
  double get_scale() const;        // 1.0 when disabled, as in PyTorch
  int64_t growth_tracker() const;  // good steps since the last change
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  // What a checkpoint keeps (PyTorch's state_dict: scale and _growth_tracker).
  struct State {
    double scale;
    int64_t growth_tracker;
  };
  State state() const { return {get_scale(), growth_tracker()}; }
  void load_state(const State& state);

 private:
  enum class Stage { ready, unscaled, stepped };
  struct PerOptimizer {
    Stage stage = Stage::ready;
    bool found_inf = false;        // read back (the host decides the step)
    bool skips_on_device = false;  // the device decides the step
  };
  // The scalars on the CUDA device (0-d: scale f32, growth_tracker i64, inv_scale f32).
  struct OnDevice {
    Device device;
    Tensor scale, growth_tracker, inv_scale;
  };
  void to_device(Device device);

  GradScalerOptions options_;
  float scale_;  // on the host (CPU tensors; before the first CUDA use)
  int64_t growth_tracker_ = 0;
  std::optional<OnDevice> on_device_;
  std::unordered_map<const optim::Optimizer*, PerOptimizer> per_optimizer_;
  // Each optimizer's inf/NaN flag on the device, kept across iterations (a CUDA graph captures
  // its address).
  std::unordered_map<const optim::Optimizer*, Tensor> found_on_device_;
  std::unordered_map<const optim::Optimizer*, bool> decided_on_device_;  // by the last unscale_
};

}  // namespace rg::amp
