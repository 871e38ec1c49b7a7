// Optimizer state management; the arithmetic lives in the fused kernels::cpu / kernels::cuda
// sgd_step and adam_step.
#include "layers/optim/optimizer.h"

#include <cmath>

#include "engine/autograd/grad_mode.h"
#include "engine/dispatch.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "kernels/cpu/optim.h"
#include "kernels/cuda/optim.h"
#include "kernels/error.h"

namespace rg::optim {

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)) {
  for (size_t i = 0; i < params_.size(); ++i) {
    RG_CHECK(params_[i].defined() && params_[i].is_leaf() && params_[i].requires_grad(),
             "optimizer: parameter ", i, " must be a leaf tensor that requires grad");
  }
  set_lr(lr);
}

void Optimizer::set_lr(double lr) {
  RG_CHECK(std::isfinite(lr) && lr >= 0, "optimizer: invalid learning rate ", lr);
  lr_ = lr;
}

void Optimizer::check_grad(const Tensor& p, const Tensor& g, size_t i) const {
  RG_CHECK(g.device() == p.device() && g.dtype() == p.dtype() && g.shape() == p.shape(), name(),
           ": the gradient of parameter ", i, " (", dtype_name(g.dtype()), " ",
           shape_str(g.shape()), " on ", g.device().str(), ") does not match the parameter (",
           dtype_name(p.dtype()), " ", shape_str(p.shape()), " on ", p.device().str(), ")");
}

void Optimizer::zero_grad(bool set_to_none) {
  for (const Tensor& p : params_) p.zero_grad(set_to_none);
}

Sgd::Sgd(std::vector<Tensor> params, SgdOptions options)
    : Optimizer(std::move(params), options.lr), options_(options), momentum_(params_.size()) {
  RG_CHECK(options.momentum >= 0, "sgd: invalid momentum ", options.momentum);
  RG_CHECK(options.weight_decay >= 0, "sgd: invalid weight_decay ", options.weight_decay);
  RG_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
           "sgd: Nesterov momentum requires a momentum > 0 and zero dampening");
}

void Sgd::step() {
  NoGradGuard no_grad;
  const kernels::cpu::SgdParams s{lr_, options_.momentum, options_.dampening, options_.weight_decay,
                                  options_.nesterov};
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    const bool first = options_.momentum != 0 && !momentum_[i].defined();
    if (first) momentum_[i] = empty_like(p);
    check_grad(p, g, i);
    dispatch_on(p.device(), p.dtype(), "sgd", [&]<class T, bool kCuda>() {
      T* buf = options_.momentum != 0 ? momentum_[i].data<T>() : nullptr;
      if constexpr (kCuda) {
        kernels::cuda::sgd_step<T>(p.data<T>(), g.data<T>(), buf, p.numel(), s, first,
                                   cuda_stream(p));
      } else {
        kernels::cpu::sgd_step<T>(p.data<T>(), g.data<T>(), buf, p.numel(), s, first);
      }
    });
    p.bump_version();
  }
}

Adam::Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled_weight_decay)
    : Optimizer(std::move(params), options.lr),
      options_(options),
      decoupled_(decoupled_weight_decay),
      m_(params_.size()),
      v_(params_.size()),
      steps_(params_.size(), 0) {
  RG_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
           name(), ": betas must be in [0, 1), got (", options.beta1, ", ", options.beta2, ")");
  RG_CHECK(options.eps >= 0, name(), ": invalid eps ", options.eps);
  RG_CHECK(options.weight_decay >= 0, name(), ": invalid weight_decay ", options.weight_decay);
}

void Adam::step() {
  NoGradGuard no_grad;
  const kernels::cpu::AdamParams a{lr_,          options_.beta1,        options_.beta2,
                                   options_.eps, options_.weight_decay, decoupled_};
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!m_[i].defined()) {
      m_[i] = zeros_like(p);
      v_[i] = zeros_like(p);
    }
    const int64_t step = ++steps_[i];
    check_grad(p, g, i);
    dispatch_on(p.device(), p.dtype(), name().c_str(), [&]<class T, bool kCuda>() {
      if constexpr (kCuda) {
        kernels::cuda::adam_step<T>(p.data<T>(), g.data<T>(), m_[i].data<T>(), v_[i].data<T>(),
                                    p.numel(), a, step, cuda_stream(p));
      } else {
        kernels::cpu::adam_step<T>(p.data<T>(), g.data<T>(), m_[i].data<T>(), v_[i].data<T>(),
                                   p.numel(), a, step);
      }
    });
    p.bump_version();
  }
}

std::unique_ptr<Optimizer> make_adamw(std::vector<Tensor> params, AdamOptions options) {
  return std::make_unique<Adam>(std::move(params), options, /*decoupled_weight_decay=*/true);
}

}  // namespace rg::optim
