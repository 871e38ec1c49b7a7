// Optimizers over a list of parameters: SGD (momentum, dampening, Nesterov, weight decay), Adam
// and AdamW, with PyTorch's update formulas. The learning rate is set by a schedule per step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace rg::optim {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  // Updates every parameter that has a gradient; parameters without one are skipped.
  virtual void step() = 0;
  void zero_grad(bool set_to_none = true);
  double lr() const { return lr_; }
  void set_lr(double lr);
  const std::vector<Tensor>& params() const { return params_; }
  virtual std::string name() const = 0;

  // The per-parameter state for checkpoints, named "<parameter index>.<key>" with PyTorch's keys
  // (sgd: momentum_buffer; adam/adamw: exp_avg, exp_avg_sq, step), on the parameters' devices.
  // Parameters that have not been stepped yet have none.
  virtual NamedTensors state() const = 0;
  // Restores what state() returned for parameters of the same shapes, replacing all current
  // state. Unknown keys, bad indices, shape mismatches and incomplete entries are clear errors.
  void load_state(const NamedTensors& state);

 protected:
  virtual void clear_state() = 0;
  // Takes one state entry; false when `key` is not one of this optimizer's.
  virtual bool restore_state(size_t index, const std::string& key, const Tensor& value) = 0;
  // Checks the restored state is complete (e.g. Adam's moments come with their step count).
  virtual void check_state() const {}
  // A new tensor on parameter `index`'s device with its dtype, holding `value` (same shape).
  Tensor state_like(size_t index, const std::string& key, const Tensor& value) const;

  // The gradient has the parameter's device, dtype and shape (a clear error otherwise).
  void check_grad(const Tensor& p, const Tensor& g, size_t i) const;

  std::vector<Tensor> params_;
  double lr_;
};

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<Tensor> params, SgdOptions options);
  void step() override;
  std::string name() const override { return "sgd"; }
  const Tensor& momentum_buffer(size_t i) const { return momentum_[i]; }
  NamedTensors state() const override;

 private:
  void clear_state() override;
  bool restore_state(size_t index, const std::string& key, const Tensor& value) override;

  SgdOptions options_;
  std::vector<Tensor> momentum_;  // undefined until a parameter's first step
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // Adam: L2 added to the gradient; AdamW: decoupled decay
};

class Adam final : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled_weight_decay = false);
  void step() override;
  std::string name() const override { return decoupled_ ? "adamw" : "adam"; }
  NamedTensors state() const override;

 private:
  void clear_state() override;
  bool restore_state(size_t index, const std::string& key, const Tensor& value) override;
  void check_state() const override;

  AdamOptions options_;
  bool decoupled_;
  std::vector<Tensor> m_, v_;
  std::vector<int64_t> steps_;
};

// Adam with decoupled weight decay. torch.optim.AdamW defaults to weight_decay 0.01; pass it.
std::unique_ptr<Optimizer> make_adamw(std::vector<Tensor> params, AdamOptions options);

}  // namespace rg::optim
