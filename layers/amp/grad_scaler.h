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
// starts the next iteration; calls out of that order are clear errors, as in PyTorch. On CUDA the
// inf/NaN flag is computed on the device and read back once per unscale_ (one synchronization,
// which PyTorch makes in step()).
#pragma once

#include <cstdint>
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
  Tensor scale(const Tensor& loss) const;
  // Multiplies every gradient of the optimizer's parameters by 1/scale in place and records
  // whether any was inf or NaN. f16 gradients are refused (keep f32 master weights).
  void unscale_(optim::Optimizer& optimizer);
  // Unscales unless unscale_ ran, then calls optimizer.step() unless a gradient was inf or NaN.
  // Returns whether the optimizer stepped.
  bool step(optim::Optimizer& optimizer);
  // Adjusts the scale from this iteration's inf/NaN checks (at least one step or unscale_ must
  // have run) and starts the next iteration.
  void update();
  // Sets the scale instead (> 0 and finite) and starts the next iteration.
  void update(double new_scale);

  double get_scale() const;                                   // 1.0 when disabled, as in PyTorch
  int64_t growth_tracker() const { return growth_tracker_; }  // good steps since the last change
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  // What a checkpoint keeps (PyTorch's state_dict: scale and _growth_tracker).
  struct State {
    double scale;
    int64_t growth_tracker;
  };
  State state() const { return {get_scale(), growth_tracker_}; }
  void load_state(const State& state);

 private:
  enum class Stage { ready, unscaled, stepped };
  struct PerOptimizer {
    Stage stage = Stage::ready;
    bool found_inf = false;
  };

  GradScalerOptions options_;
  float scale_;
  int64_t growth_tracker_ = 0;
  std::unordered_map<const optim::Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace rg::amp
