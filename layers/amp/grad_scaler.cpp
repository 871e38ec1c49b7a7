// GradScaler bookkeeping; the unscale + inf/NaN check is kernels::cpu / kernels::cuda
// unscale_check_finite, one pass over each gradient.
#include "layers/amp/grad_scaler.h"

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/dispatch.h"
#include "engine/ops/binary.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "kernels/cpu/grad_scaler.h"
#include "kernels/cuda/grad_scaler.h"
#include "kernels/error.h"
#include "layers/optim/optimizer.h"

namespace rg::amp {
namespace {

bool is_valid_scale(double s) {
  return std::isfinite(s) && s > 0 && s <= std::numeric_limits<float>::max();
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  RG_CHECK(is_valid_scale(options_.init_scale),
           "GradScaler: init_scale must be positive, finite and within f32, got ",
           options_.init_scale);
  RG_CHECK(options_.growth_factor > 1.0 && std::isfinite(options_.growth_factor),
           "GradScaler: growth_factor must be > 1, got ", options_.growth_factor);
  RG_CHECK(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0,
           "GradScaler: backoff_factor must be in (0, 1), got ", options_.backoff_factor);
  RG_CHECK(options_.growth_interval > 0, "GradScaler: growth_interval must be > 0, got ",
           options_.growth_interval);
  scale_ = static_cast<float>(options_.init_scale);
}

double GradScaler::get_scale() const { return options_.enabled ? double(scale_) : 1.0; }

Tensor GradScaler::scale(const Tensor& loss) const {
  RG_CHECK(loss.defined(), "GradScaler.scale: the loss is undefined");
  if (!options_.enabled) return loss;
  RG_CHECK(is_floating(loss.dtype()), "GradScaler.scale: expected a floating-point loss, got ",
           dtype_name(loss.dtype()));
  const bool half = is_half(loss.dtype());
  return mul(half ? loss.to(DType::f32) : loss, double(scale_));
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  PerOptimizer& st = per_optimizer_[&optimizer];
  RG_CHECK(st.stage != Stage::unscaled,
           "GradScaler.unscale_: already called on this optimizer since the last update()");
  RG_CHECK(st.stage != Stage::stepped,
           "GradScaler.unscale_: called after step(); call update() "
           "first");
  // Every gradient is checked before any is touched, as PyTorch does.
  std::vector<Tensor> grads;
  const auto& params = optimizer.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor g = params[i].grad();
    if (!g.defined() || g.numel() == 0) continue;
    RG_CHECK(g.dtype() != DType::f16, "GradScaler.unscale_: the gradient of parameter ", i,
             " is f16; keep f32 master weights (as PyTorch, which refuses to unscale f16 "
             "gradients)");
    grads.push_back(g);
  }
  // 1/scale in f64, then rounded to f32, as PyTorch computes it.
  const auto inv_scale = static_cast<float>(1.0 / double(scale_));
  NoGradGuard no_grad;
  bool found = false;
  // On CUDA: one found-inf flag and one 1/scale per device, read back once at the end.
  struct DeviceScalars {
    Tensor found_inf, inv_scale;
  };
  std::map<int, DeviceScalars> on_device;
  for (const Tensor& g : grads) {
    dispatch_on(g.device(), g.dtype(), "GradScaler.unscale_", [&]<class T, class B>() {
      if constexpr (kOnCuda<B>) {
        DeviceScalars& d = on_device[g.device().index];
        if (!d.found_inf.defined()) {
          d.found_inf = zeros({1}, DType::f32, g.device());
          d.inv_scale = full({1}, inv_scale, DType::f32, g.device());
        }
        kernels::cuda::unscale_check_finite<T>(g.data<T>(), g.numel(), d.found_inf.data<float>(),
                                               d.inv_scale.data<float>(), cuda_stream(g));
      } else {
        found |= kernels::cpu::unscale_check_finite<T>(g.data<T>(), g.numel(), inv_scale);
      }
    });
    g.bump_version();
  }
  for (const auto& [index, d] : on_device) found |= d.found_inf.item<float>() != 0.0f;
  st.found_inf = found;
  st.stage = Stage::unscaled;
}

bool GradScaler::step(optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  PerOptimizer& st = per_optimizer_[&optimizer];
  RG_CHECK(st.stage != Stage::stepped,
           "GradScaler.step: already called on this optimizer since the last update()");
  if (st.stage == Stage::ready) unscale_(optimizer);
  const bool stepped = !st.found_inf;
  if (stepped) optimizer.step();
  st.stage = Stage::stepped;
  return stepped;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  bool checked = false, found_inf = false;
  for (const auto& [opt, st] : per_optimizer_) {
    if (st.stage == Stage::ready) continue;
    checked = true;
    found_inf |= st.found_inf;
  }
  RG_CHECK(checked,
           "GradScaler.update: no inf/NaN checks were recorded since the last update() "
           "(call step() or unscale_() first)");
  if (found_inf) {
    scale_ = static_cast<float>(double(scale_) * options_.backoff_factor);
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval) {
    const auto grown = static_cast<float>(double(scale_) * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;  // else keep the scale, as PyTorch does
    growth_tracker_ = 0;
  }
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  RG_CHECK(is_valid_scale(new_scale),
           "GradScaler.update: the new scale must be positive, finite and within f32, got ",
           new_scale);
  scale_ = static_cast<float>(new_scale);
  per_optimizer_.clear();
}

void GradScaler::load_state(const State& state) {
  RG_CHECK(is_valid_scale(state.scale),
           "GradScaler.load_state: the scale must be positive, finite and within f32, got ",
           state.scale);
  RG_CHECK(state.growth_tracker >= 0 && state.growth_tracker < options_.growth_interval,
           "GradScaler.load_state: growth_tracker ", state.growth_tracker,
           " is outside [0, growth_interval = ", options_.growth_interval, ")");
  scale_ = static_cast<float>(state.scale);
  growth_tracker_ = state.growth_tracker;
  per_optimizer_.clear();
}

}  // namespace rg::amp
