// Optimizers over a list of parameters: SGD (momentum, dampening, Nesterov, weight decay), Adam
// and AdamW, with PyTorch's update formulas. The learning rate is set by a schedule per step.
// Parameters come in one list or in groups with their own weight decay (PyTorch's param_groups).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace rg::optim {

// One of PyTorch's param_groups: parameters with their own weight decay (unset: the optimizer's
// options). An empty group is allowed; a parameter in two groups is an rg::Error.
struct ParamGroup {
  std::vector<Tensor> params;
  std::optional<double> weight_decay;
};

// What a group became, for printing: how many tensors and elements, and its weight decay.
struct GroupInfo {
  size_t tensors = 0;
  int64_t numel = 0;
  double weight_decay = 0.0;
};

class Optimizer {
 public:
  // The groups' parameters in order make the flat list params(); `weight_decay` fills the groups
  // that leave theirs unset.
  Optimizer(std::vector<ParamGroup> groups, double lr, double weight_decay);
  virtual ~Optimizer() = default;
  // Updates every parameter that has a gradient; parameters without one are skipped.
  virtual void step() = 0;
  // For GradScaler on CUDA (layers/amp/grad_scaler.h): whether step_unless can run now, that is
  // the optimizer takes a step that the device skips when a flag is set, without the host reading
  // it (SGD, Adam), every parameter with a gradient is on CUDA and, for SGD, has its state (SGD's
  // first step with momentum starts its buffer from the gradient, which a skipped step must not).
  virtual bool can_skip_on_device() const { return false; }
  // step(), skipped on the device when `skip_if` (a one-element f32 tensor on the parameters'
  // CUDA device, GradScaler's found-inf) is nonzero; only when can_skip_on_device().
  virtual void step_unless(const Tensor& skip_if);
  void zero_grad(bool set_to_none = true);
  double lr() const { return lr_; }
  void set_lr(double lr);
  // All groups' parameters, in group order.
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<GroupInfo>& groups() const { return groups_; }
  // The weight decay of params()[i], from its group.
  double weight_decay(size_t i) const { return weight_decay_[i]; }
  virtual std::string name() const = 0;
  // In a CUDA graph capture (engine/cuda/graph.h) step() takes what changes between steps (the
  // learning rate; Adam's step counts and bias corrections, or with its counts on the device its
  // rate and weight decays) from device memory that each replay writes first: replays follow a
  // schedule and match eager steps bit for bit. An optimizer's first step (new state) inside a
  // capture is an error.

  // The per-parameter state for checkpoints, named "<parameter index>.<key>" with PyTorch's keys
  // (the index counts over all groups in order, as torch's optimizer.state_dict() numbers them)
  // (sgd: momentum_buffer; adam/adamw: exp_avg, exp_avg_sq, step), on the parameters' devices.
  // Parameters that have not been stepped yet have none.
  virtual NamedTensors state() const = 0;
  // Restores what state() returned for parameters of the same shapes, replacing all current
  // state. Unknown keys, bad indices, shape mismatches and incomplete entries are clear errors.
  void load_state(const NamedTensors& state);
  // Counts load_state calls (even failed ones, which restore the previous state in new tensors)
  // and Adam's move of its step counts to the device: a CUDA graph captured before one updates
  // the old state's buffers (train::GraphStep captures again when it changes).
  uint64_t state_version() const { return state_version_; }

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
  // State tensor `state` of parameter i in the parameter's memory format (converted when the
  // parameter changed layout since, Module::to(MemoryFormat)): the updates read them together.
  void follow_layout(Tensor& state, size_t i) const;

  std::vector<Tensor> params_;
  double lr_;
  uint64_t state_version_ = 0;

 private:
  std::vector<double> weight_decay_;  // per parameter
  std::vector<GroupInfo> groups_;
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
  Sgd(std::vector<ParamGroup> groups, SgdOptions options);
  void step() override { step_impl(nullptr); }
  bool can_skip_on_device() const override;
  void step_unless(const Tensor& skip_if) override;
  std::string name() const override { return "sgd"; }
  const Tensor& momentum_buffer(size_t i) const { return momentum_[i]; }
  NamedTensors state() const override;

 private:
  void clear_state() override;
  bool restore_state(size_t index, const std::string& key, const Tensor& value) override;
  void step_impl(const Tensor* skip_if);

  SgdOptions options_;
  std::vector<Tensor> momentum_;  // undefined until a parameter's first step
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // Adam: L2 added to the gradient; AdamW: decoupled decay.
                              // The default of groups that leave theirs unset.
};

class Adam final : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled_weight_decay = false);
  Adam(std::vector<ParamGroup> groups, AdamOptions options, bool decoupled_weight_decay = false);
  void step() override { step_impl(nullptr); }
  // On CUDA when every parameter with a gradient is on one device and the bias corrections
  // reach exactly 1 within 2^20 steps (betas up to about 0.99996): the step counts
  // then move to the device (the first step_unless; state() reads them back), where a kernel
  // counts each step the flag does not skip and computes the bias corrections from a table the
  // host computed, so the updates are the host-counted ones bit for bit.
  bool can_skip_on_device() const override;
  void step_unless(const Tensor& skip_if) override;
  // Whether its betas let the step counts move to the device (adam_bias_table is not empty).
  bool counts_fit_on_device() const { return !bias_table().empty(); }
  std::string name() const override { return decoupled_ ? "adamw" : "adam"; }
  NamedTensors state() const override;

 private:
  struct OnDevice;  // the step counts and what their kernel reads, once they are on the device
  void step_impl(const Tensor* skip_if);
  void clear_state() override;
  bool restore_state(size_t index, const std::string& key, const Tensor& value) override;
  void check_state() const override;
  void write_replay_values(const std::vector<size_t>& live, const Tensor& slots);
  void write_hyperparameters(OnDevice& d) const;
  std::vector<int64_t> step_counts() const;  // the device's, once they live there

  AdamOptions options_;
  bool decoupled_;
  std::vector<Tensor> m_, v_;
  std::vector<int64_t> steps_;                    // the counts, while on the host
  const std::vector<double>& bias_table() const;  // adam_bias_table(betas), at the first call
  mutable std::vector<double> bias_table_;
  mutable bool bias_table_done_ = false;
  std::shared_ptr<OnDevice> on_device_;
};

// 1 - beta1^t and 1 / sqrt(1 - beta2^t), interleaved, for t = 0 .. last, both exactly 1 from
// `last` on, as Adam computes them on the host; empty when that takes more than 2^20 steps (beta2
// above about 0.99996): Adam's step counts then stay on the host (Adam::can_skip_on_device).
std::vector<double> adam_bias_table(double beta1, double beta2);

// Adam with decoupled weight decay. torch.optim.AdamW defaults to weight_decay 0.01; pass it.
std::unique_ptr<Optimizer> make_adamw(std::vector<Tensor> params, AdamOptions options);
std::unique_ptr<Optimizer> make_adamw(std::vector<ParamGroup> groups, AdamOptions options);

}  // namespace rg::optim
