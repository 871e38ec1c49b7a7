// GradScaler bookkeeping; the unscale + inf/NaN check is kernels::cpu / kernels::cuda
// unscale_check_finite, one pass over each gradient.
#include "layers/amp/grad_scaler.h"

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/cuda/graph.h"
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

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return on_device_ ? double(on_device_->scale.item<float>()) : double(scale_);
}

bool GradScaler::decides_on_device(const optim::Optimizer& optimizer) const {
  auto it = decided_on_device_.find(&optimizer);
  return it != decided_on_device_.end() && it->second;
}

int64_t GradScaler::growth_tracker() const {
  return on_device_ ? on_device_->growth_tracker.item<int64_t>() : growth_tracker_;
}

void GradScaler::to_device(Device device) {
  if (on_device_) {
    RG_CHECK(on_device_->device == device, "GradScaler: its scale lives on ",
             on_device_->device.str(), ", now used with tensors on ", device.str(),
             " (one scaler per device)");
    return;
  }
  NoGradGuard no_grad;
  on_device_ = OnDevice{device, full({}, double(scale_), DType::f32, device),
                        full({}, double(growth_tracker_), DType::i64, device),
                        Tensor::empty({}, DType::f32, device)};
}

Tensor GradScaler::scale(const Tensor& loss) {
  RG_CHECK(loss.defined(), "GradScaler.scale: the loss is undefined");
  if (!options_.enabled) return loss;
  RG_CHECK(is_floating(loss.dtype()), "GradScaler.scale: expected a floating-point loss, got ",
           dtype_name(loss.dtype()));
  const bool half = is_half(loss.dtype());
  const Tensor l = half ? loss.to(DType::f32) : loss;
  if (!loss.device().is_cuda()) {
    RG_CHECK(!on_device_, "GradScaler: its scale lives on ", on_device_->device.str(),
             ", now used with a loss on ", loss.device().str());
    return mul(l, double(scale_));
  }
  to_device(loss.device());
  // The scale as a tensor: read by the kernel, so a replayed step sees the current one.
  const Tensor s = l.dtype() == DType::f32 ? on_device_->scale : on_device_->scale.to(l.dtype());
  return mul(l, s);
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
  NoGradGuard no_grad;
  for (const Tensor& g : grads)
    if (g.device().is_cuda()) to_device(g.device());  // refuses a second device
  st.skips_on_device = false;
  if (!on_device_) {
    // 1/scale in f64, then rounded to f32, as PyTorch computes it.
    const auto inv_scale = static_cast<float>(1.0 / double(scale_));
    bool found = false;
    for (const Tensor& g : grads) {
      RG_CHECK(!g.device().is_cuda(), "GradScaler.unscale_: a CUDA gradient on the host path");
      dispatch_on(g.device(), g.dtype(), "GradScaler.unscale_", [&]<class T, class B>() {
        if constexpr (!kOnCuda<B>)
          found |= kernels::cpu::unscale_check_finite<T>(g.data<T>(), g.numel(), inv_scale);
      });
      g.bump_version();
    }
    st.found_inf = found;
    st.stage = Stage::unscaled;
    return;
  }
  // On the device: 1/scale and the optimizer's flag there, no value read back unless the
  // optimizer cannot skip a step on the device.
  const OnDevice& d = *on_device_;
  for (const Tensor& g : grads)
    RG_CHECK(g.device() == d.device, "GradScaler.unscale_: a gradient on ", g.device().str(),
             " but the scale lives on ", d.device.str(),
             " (one scaler per CUDA device; gradients on the CPU or on two devices are not "
             "supported once the scale is on a GPU)");
  st.skips_on_device = optimizer.can_skip_on_device();
  RG_CHECK(st.skips_on_device || cuda::Graph::capturing() == nullptr,
           "GradScaler: ", optimizer.name(),
           " cannot skip a step on the device now (SGD's first momentum step, Adam's betas too "
           "close to 1, or parameters off the scale's GPU), so the overflow check is read back, "
           "which a CUDA graph capture cannot do");
  Tensor& found = found_on_device_[&optimizer];
  if (!found.defined())
    found = zeros({1}, DType::f32, d.device);
  else
    found.zero_();
  // (through the dispatch, so that builds without CUDA never reference the CUDA kernels)
  dispatch_on(d.device, DType::f32, "GradScaler.unscale_", [&]<class T, class B>() {
    if constexpr (kOnCuda<B> && std::is_same_v<T, float>)
      kernels::cuda::inverse_scale(d.scale.data<T>(), d.inv_scale.data<T>(), cuda_stream(d.scale));
  });
  for (const Tensor& g : grads) {
    dispatch_on(g.device(), g.dtype(), "GradScaler.unscale_", [&]<class T, class B>() {
      if constexpr (kOnCuda<B>)
        kernels::cuda::unscale_check_finite<T>(g.data<T>(), g.numel(), found.data<float>(),
                                               d.inv_scale.data<float>(), cuda_stream(g));
    });
    g.bump_version();
  }
  decided_on_device_[&optimizer] = st.skips_on_device;
  if (!st.skips_on_device) st.found_inf = found.item<float>() != 0.0f;
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
  if (st.skips_on_device && !optimizer.can_skip_on_device()) {
    // A gradient appeared since unscale_ on a parameter without state: decided on the host.
    RG_CHECK(cuda::Graph::capturing() == nullptr, "GradScaler.step: ", optimizer.name(),
             " can no longer skip this step on the device, inside a CUDA graph capture");
    st.skips_on_device = false;
    st.found_inf = found_on_device_.at(&optimizer).item<float>() != 0.0f;
  }
  if (st.skips_on_device) {
    optimizer.step_unless(found_on_device_.at(&optimizer));
    st.stage = Stage::stepped;
    return true;
  }
  const bool stepped = !st.found_inf;
  if (stepped) optimizer.step();
  st.stage = Stage::stepped;
  return stepped;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  bool checked = false, found_inf = false;
  Tensor found_on_device;  // any optimizer's flag (a sum of them)
  for (const auto& [opt, st] : per_optimizer_) {
    if (st.stage == Stage::ready) continue;
    checked = true;
    found_inf |= st.found_inf;
    if (on_device_) {
      // Every optimizer unscaled since the scale moved to the device has a flag there; one
      // unscaled on the host before that (its gradients on the CPU) is refused by unscale_.
      auto f = found_on_device_.find(opt);
      RG_CHECK(f != found_on_device_.end(), "GradScaler.update: optimizer ", opt->name(),
               " was unscaled on the host and another on ", on_device_->device.str(),
               " in one iteration (one scaler per CUDA device)");
      found_on_device = found_on_device.defined() ? add(found_on_device, f->second) : f->second;
    }
  }
  RG_CHECK(checked,
           "GradScaler.update: no inf/NaN checks were recorded since the last update() "
           "(call step() or unscale_() first)");
  if (on_device_) {
    const OnDevice& d = *on_device_;
    dispatch_on(d.device, DType::f32, "GradScaler.update", [&]<class T, class B>() {
      if constexpr (kOnCuda<B> && std::is_same_v<T, float>)
        kernels::cuda::update_scale(d.scale.data<T>(), d.growth_tracker.data<int64_t>(),
                                    found_on_device.data<T>(), options_.growth_factor,
                                    options_.backoff_factor, options_.growth_interval,
                                    cuda_stream(d.scale));
    });
  } else if (found_inf) {
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
  if (on_device_) on_device_->scale.fill_(double(scale_));
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
  if (on_device_) {
    on_device_->scale.fill_(double(scale_));
    on_device_->growth_tracker.fill_(double(growth_tracker_));
  }
  per_optimizer_.clear();
}

}  // namespace rg::amp
