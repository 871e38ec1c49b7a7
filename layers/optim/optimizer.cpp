// Optimizer state management; the arithmetic lives in the fused kernels::cpu / kernels::cuda
// sgd_step and adam_step.
#include "layers/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/cuda/graph.h"
#include "engine/cuda/stream_trace.h"
#include "engine/dispatch.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "kernels/cuda/optim.h"
#include "kernels/error.h"
#include "kernels/optim.h"

namespace rg::optim {

namespace {

// Where a step's span goes while tracing (cuda::OpSpan: one span per step on the parameters'
// stream, around the per-parameter kernels, which get none of their own).
Device params_device(const std::vector<Tensor>& params) {
  return params.empty() ? Device::cpu() : params.front().device();
}

// The indices of the parameters to update, grouped by (device, dtype) in first-seen order: each
// group is one multi-tensor kernel call (kernels::Optim<B>::*_step_many).
std::vector<std::vector<size_t>> update_groups(const std::vector<Tensor>& params,
                                               const std::vector<size_t>& indices) {
  std::vector<std::vector<size_t>> groups;
  std::vector<std::pair<Device, DType>> keys;
  for (size_t i : indices) {
    const std::pair<Device, DType> key{params[i].device(), params[i].dtype()};
    const auto it = std::find(keys.begin(), keys.end(), key);
    if (it == keys.end()) {
      keys.push_back(key);
      groups.push_back({i});
    } else {
      groups[size_t(it - keys.begin())].push_back(i);
    }
  }
  return groups;
}

}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr, double weight_decay) {
  std::set<const TensorImpl*> earlier;  // the parameters of the groups before
  for (size_t g = 0; g < groups.size(); ++g) {
    const double wd = groups[g].weight_decay.value_or(weight_decay);
    RG_CHECK(std::isfinite(wd) && wd >= 0, "optimizer: invalid weight_decay ", wd, " of group ", g);
    GroupInfo info{groups[g].params.size(), 0, wd};
    std::set<const TensorImpl*> mine;
    for (Tensor& p : groups[g].params) {
      const size_t i = params_.size();
      RG_CHECK(p.defined() && p.is_leaf() && p.requires_grad(), "optimizer: parameter ", i,
               " must be a leaf tensor that requires grad");
      RG_CHECK(!earlier.contains(p.impl()),
               "optimizer: some parameters appear in more than one "
               "parameter group (parameter ",
               i, " of group ", g, ")");
      mine.insert(p.impl());
      info.numel += p.numel();
      params_.push_back(std::move(p));
      weight_decay_.push_back(wd);
    }
    earlier.merge(mine);
    groups_.push_back(info);
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
  // The update reads parameter, gradient and state element by element in memory: one layout.
  RG_CHECK(g.memory_format() == p.memory_format(), name(), ": the gradient of parameter ", i,
           " is ", memory_format_name(g.memory_format()), " but the parameter is ",
           memory_format_name(p.memory_format()), " (set .grad in the parameter's format)");
}

void Optimizer::follow_layout(Tensor& state, size_t i) const {
  const MemoryFormat f = params_[i].memory_format();
  if (state.defined() && state.memory_format() != f) state = state.contiguous(f);
}

void Optimizer::step_unless(const Tensor&) {
  RG_FAIL(name(),
          ": cannot skip a step on the device (its state is counted on the host); read "
          "the flag and call step()");
}

void Optimizer::zero_grad(bool set_to_none) {
  for (const Tensor& p : params_) p.zero_grad(set_to_none);
}

void Optimizer::load_state(const NamedTensors& state) {
  // Names first: "<index>.<key>", the index in decimal without leading zeros, each name once.
  struct Entry {
    size_t index;
    std::string key;
    Tensor value;
  };
  const auto parse = [&](const NamedTensors& named) {
    std::vector<Entry> entries;
    std::set<std::string> seen;
    for (const auto& [name, value] : named) {
      RG_CHECK(seen.insert(name).second, this->name(), ".load_state: '", name, "' appears twice");
      const size_t dot = name.find('.');
      const std::string digits = name.substr(0, dot);
      const bool ok = dot != std::string::npos && !digits.empty() && digits.size() <= 9 &&
                      digits.find_first_not_of("0123456789") == std::string::npos &&
                      (digits == "0" || digits[0] != '0');
      const size_t index = ok ? size_t(std::stoul(digits)) : params_.size();
      RG_CHECK(index < params_.size(), this->name(), ".load_state: '", name,
               "' does not name the state of one of the ", params_.size(), " parameters");
      entries.push_back({index, name.substr(dot + 1), value});
    }
    return entries;
  };
  const auto restore = [&](const std::vector<Entry>& entries) {
    ++state_version_;
    clear_state();
    for (const Entry& e : entries) {
      RG_CHECK(restore_state(e.index, e.key, e.value), this->name(), ".load_state: unknown state '",
               e.key, "' of parameter ", e.index);
    }
    check_state();
  };
  const std::vector<Entry> entries = parse(state);
  const std::vector<Entry> previous = parse(this->state());
  try {
    restore(entries);
  } catch (...) {
    restore(previous);  // a failed load changes nothing
    throw;
  }
}

Tensor Optimizer::state_like(size_t index, const std::string& key, const Tensor& value) const {
  const Tensor& p = params_[index];
  RG_CHECK(value.defined() && value.shape() == p.shape(), name(), ".load_state: ", key,
           " of parameter ", index, " has shape ",
           value.defined() ? shape_str(value.shape()) : "(undefined)", ", the parameter ",
           shape_str(p.shape()));
  Tensor t = empty_like(p);
  t.copy_(value);
  return t;
}

Sgd::Sgd(std::vector<Tensor> params, SgdOptions options)
    : Sgd(std::vector<ParamGroup>{{std::move(params), std::nullopt}}, options) {}

Sgd::Sgd(std::vector<ParamGroup> groups, SgdOptions options)
    : Optimizer(std::move(groups), options.lr, options.weight_decay),
      options_(options),
      momentum_(params_.size()) {
  RG_CHECK(options.momentum >= 0, "sgd: invalid momentum ", options.momentum);
  RG_CHECK(options.weight_decay >= 0, "sgd: invalid weight_decay ", options.weight_decay);
  RG_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
           "sgd: Nesterov momentum requires a momentum > 0 and zero dampening");
}

bool Sgd::can_skip_on_device() const {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    if (!g.device().is_cuda() || !params_[i].device().is_cuda()) return false;
    if (options_.momentum != 0 && !momentum_[i].defined()) return false;
  }
  return true;
}

void Sgd::step_unless(const Tensor& skip_if) {
  RG_CHECK(skip_if.defined() && skip_if.numel() == 1 && skip_if.dtype() == DType::f32 &&
               skip_if.device().is_cuda(),
           "sgd.step_unless: the flag must be one f32 on a CUDA device");
  RG_CHECK(can_skip_on_device(),
           "sgd.step_unless: a parameter is not on CUDA or takes its "
           "first momentum step (call step() after reading the flag)");
  for (size_t i = 0; i < params_.size(); ++i)  // before anything is launched
    RG_CHECK(!params_[i].grad().defined() || params_[i].device() == skip_if.device(),
             "sgd.step_unless: the flag is on ", skip_if.device().str(), ", parameter ", i, " on ",
             params_[i].device().str());
  step_impl(&skip_if);
}

void Sgd::step_impl(const Tensor* skip_if) {
  NoGradGuard no_grad;
  const cuda::OpSpan span("sgd.step", "optimizer", params_device(params_));
  const kernels::SgdParams s{lr_, options_.momentum, options_.dampening, 0.0, options_.nesterov};
  std::vector<size_t> live;                 // the parameters with a gradient
  std::vector<char> first(params_.size());  // whose momentum buffer is new
  const bool capturing = cuda::Graph::capturing() != nullptr;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    check_grad(params_[i], g, i);
    first[i] = options_.momentum != 0 && !momentum_[i].defined();
    // Each replay would repeat the first step (buffer = gradient) instead of accumulating.
    RG_CHECK(!(first[i] && capturing), "sgd: parameter ", i,
             "'s first step (which starts its "
             "momentum buffer) inside a CUDA graph capture: step once before capturing");
    if (first[i]) momentum_[i] = empty_like(params_[i]);
    follow_layout(momentum_[i], i);
    live.push_back(i);
  }
  // In a capture the learning rate is the replay's: each writes it to the graph's replay slots
  // first, an f32 in the first slot and an f64 in the second (the kernels' compute types).
  Tensor slots;
  if (cuda::Graph* graph = cuda::Graph::capturing(); graph != nullptr && !live.empty()) {
    slots = graph->replay_slots(2);
    // Written when it changed (a constant rate: at the first replay only).
    graph->on_replay([this, slots, written = std::optional<double>()]() mutable {
      if (written == lr_) return;
      written = lr_;
      Tensor host = Tensor::empty_pinned({2}, DType::i64);
      const float f = float(lr_);
      std::memcpy(host.raw_data(), &f, sizeof(f));
      std::memcpy(static_cast<char*>(host.raw_data()) + 8, &lr_, sizeof(lr_));
      Tensor(slots).copy_(host, /*non_blocking=*/true);
    });
  }
  // All parameters of one device and dtype in one multi-tensor call (a few kernel launches).
  for (const std::vector<size_t>& group : update_groups(params_, live)) {
    const Tensor& lead = params_[group.front()];
    const void* lr_slot = !slots.defined() ? nullptr
                                           : static_cast<const char*>(slots.raw_data()) +
                                                 (lead.dtype() == DType::f64 ? 8 : 0);
    dispatch_on(lead.device(), lead.dtype(), "sgd", [&]<class T, class B>() {
      std::vector<kernels::ParamUpdate<T>> updates;
      updates.reserve(group.size());
      for (size_t i : group) {
        Tensor& p = params_[i];
        T* buf = options_.momentum != 0 ? momentum_[i].data<T>() : nullptr;
        updates.push_back({p.data<T>(), p.grad().data<T>(), buf, nullptr, p.numel(),
                           weight_decay(i), first[i] != 0, 0, lr_slot});
        if (skip_if != nullptr) updates.back().skip_if = skip_if->data<float>();
      }
      kernels::Optim<B>::sgd_step_many(updates.data(), int64_t(updates.size()), s,
                                       kernel_ctx(lead));
    });
    for (size_t i : group) params_[i].bump_version();
  }
}

NamedTensors Sgd::state() const {
  NamedTensors out;
  for (size_t i = 0; i < momentum_.size(); ++i) {
    if (momentum_[i].defined())
      out.emplace_back(std::to_string(i) + ".momentum_buffer", momentum_[i]);
  }
  return out;
}

void Sgd::clear_state() {
  for (Tensor& m : momentum_) m = Tensor();
}

bool Sgd::restore_state(size_t index, const std::string& key, const Tensor& value) {
  if (key != "momentum_buffer") return false;
  momentum_[index] = state_like(index, key, value);
  return true;
}

Adam::Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled_weight_decay)
    : Adam(std::vector<ParamGroup>{{std::move(params), std::nullopt}}, options,
           decoupled_weight_decay) {}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions options, bool decoupled_weight_decay)
    : Optimizer(std::move(groups), options.lr, options.weight_decay),
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

namespace {
constexpr int64_t kMaxBiasTable = int64_t(1) << 20;  // steps
}  // namespace

struct Adam::OnDevice {
  Device device;
  Tensor counts;        // i64 [params]: each parameter's steps so far
  Tensor weight_decay;  // f64 [params]
  Tensor table;         // f64 [2 (last + 1)]: Adam::bias_table_
  int64_t last = 0;
  Tensor lr;      // f64 [1]
  Tensor values;  // f64 [3 params]: ParamUpdate::device_values, written by the counting kernel
  std::optional<double> lr_written;
  std::vector<double> weight_decay_written;
};

std::vector<double> adam_bias_table(double beta1, double beta2) {
  // 1 - beta^t rounds to 1 once beta^t < 2^-54, and beta^t only falls: from `last` on both stay 1.
  std::vector<double> table;
  for (int64_t t = 0; t <= kMaxBiasTable; ++t) {
    const double bc1 = 1.0 - std::pow(beta1, double(t));
    const double bc2 = 1.0 - std::pow(beta2, double(t));
    const double inv_sqrt_bc2 = 1.0 / std::sqrt(bc2);
    table.push_back(bc1);
    table.push_back(inv_sqrt_bc2);
    if (t >= 1 && bc1 == 1.0 && inv_sqrt_bc2 == 1.0) return table;
  }
  return {};
}

const std::vector<double>& Adam::bias_table() const {
  if (!bias_table_done_) bias_table_ = adam_bias_table(options_.beta1, options_.beta2);
  bias_table_done_ = true;
  return bias_table_;
}

bool Adam::can_skip_on_device() const {
  if (bias_table().empty()) return false;
  std::optional<Device> device;
  if (on_device_) device = on_device_->device;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    if (!g.device().is_cuda() || !params_[i].device().is_cuda()) return false;
    if (device && params_[i].device() != *device) return false;
    device = params_[i].device();
  }
  return true;
}

void Adam::step_unless(const Tensor& skip_if) {
  RG_CHECK(skip_if.defined() && skip_if.numel() == 1 && skip_if.dtype() == DType::f32 &&
               skip_if.device().is_cuda(),
           name(), ".step_unless: the flag must be one f32 on a CUDA device");
  RG_CHECK(can_skip_on_device(), name(),
           ".step_unless: a parameter is not on CUDA, the parameters are on several devices, or "
           "the betas' bias corrections take more than 2^20 steps to reach 1 (call step() after "
           "reading the flag)");
  for (size_t i = 0; i < params_.size(); ++i)  // before anything is launched
    RG_CHECK(!params_[i].grad().defined() || params_[i].device() == skip_if.device(), name(),
             ".step_unless: the flag is on ", skip_if.device().str(), ", parameter ", i, " on ",
             params_[i].device().str());
  if (!on_device_) {
    // The counts move to the device: from now on only the device knows which steps it took.
    RG_CHECK(cuda::Graph::capturing() == nullptr, name(),
             ".step_unless: its first call moves the step counts to the device, which cannot be "
             "captured: call it once before capturing");
    NoGradGuard no_grad;
    auto d = std::make_shared<OnDevice>();
    d->device = skip_if.device();
    const auto n = int64_t(params_.size());
    Tensor counts = Tensor::empty_pinned({n}, DType::i64);
    std::copy(steps_.begin(), steps_.end(), counts.data<int64_t>());
    d->counts = Tensor::empty({n}, DType::i64, d->device);
    d->counts.copy_(counts, /*non_blocking=*/true);
    const std::vector<double>& bias = bias_table();
    Tensor table = Tensor::empty_pinned({int64_t(bias.size())}, DType::f64);
    std::copy(bias.begin(), bias.end(), table.data<double>());
    d->table = Tensor::empty(table.shape(), DType::f64, d->device);
    d->table.copy_(table, /*non_blocking=*/true);
    d->last = int64_t(bias.size()) / 2 - 1;
    d->weight_decay = Tensor::empty({n}, DType::f64, d->device);
    d->lr = Tensor::empty({1}, DType::f64, d->device);
    d->values = Tensor::empty({3 * n}, DType::f64, d->device);
    on_device_ = std::move(d);
    ++state_version_;  // a graph captured before counts on the host (train::GraphStep drops it)
  }
  step_impl(&skip_if);
}

// What the counting kernel reads besides the counts, written when it changed (on the current
// stream, without blocking the host).
void Adam::write_hyperparameters(OnDevice& d) const {
  if (d.lr_written != lr_) {
    d.lr.fill_(lr_);
    d.lr_written = lr_;
  }
  std::vector<double> wd(params_.size());
  for (size_t i = 0; i < wd.size(); ++i) wd[i] = weight_decay(i);
  if (wd != d.weight_decay_written) {
    Tensor host = Tensor::empty_pinned({int64_t(wd.size())}, DType::f64);
    std::copy(wd.begin(), wd.end(), host.data<double>());
    d.weight_decay.copy_(host, /*non_blocking=*/true);
    d.weight_decay_written = std::move(wd);
  }
}

std::vector<int64_t> Adam::step_counts() const {
  if (!on_device_) return steps_;
  const Tensor host = on_device_->counts.to(Device::cpu());
  return {host.data<int64_t>(), host.data<int64_t>() + host.numel()};
}

void Adam::step_impl(const Tensor* skip_if) {
  NoGradGuard no_grad;
  const cuda::OpSpan span(decoupled_ ? "adamw.step" : "adam.step", "optimizer",
                          params_device(params_));
  const kernels::AdamParams a{lr_, options_.beta1, options_.beta2, options_.eps, 0.0, decoupled_};
  cuda::Graph* const graph = cuda::Graph::capturing();
  OnDevice* const d = on_device_.get();
  std::vector<size_t> live;  // the parameters with a gradient
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    check_grad(params_[i], g, i);
    RG_CHECK(d == nullptr || params_[i].device() == d->device, name(), ": parameter ", i, " on ",
             params_[i].device().str(), "; its step counts are on ", d ? d->device.str() : "");
    if (!m_[i].defined()) {
      // Zeroed by the capture's kernels, the moments would restart at every replay.
      RG_CHECK(graph == nullptr, name(), ": parameter ", i,
               "'s first step (which creates its "
               "moments) inside a CUDA graph capture: step once before capturing");
      m_[i] = zeros_like(params_[i]);
      v_[i] = zeros_like(params_[i]);
    }
    follow_layout(m_[i], i);
    follow_layout(v_[i], i);
    if (d == nullptr) ++steps_[i];
    live.push_back(i);
  }
  if (live.empty()) return;
  std::vector<const void*> values(params_.size(), nullptr);
  if (d != nullptr) {
    // The device counts the step unless the flag says skip, and computes the values from the
    // counts; in a capture the learning rate is the replay's (written before each one).
    if (graph != nullptr)
      graph->on_replay([this, keep = on_device_] { write_hyperparameters(*keep); });
    else
      write_hyperparameters(*d);
    const float* skip = skip_if != nullptr ? skip_if->data<float>() : nullptr;
    dispatch_on(d->device, DType::f64, name().c_str(), [&]<class T, class B>() {
      if constexpr (kOnCuda<B> && std::is_same_v<T, double>) {
        for (size_t first = 0; first < live.size(); first += kernels::cuda::AdamStepList::kMax) {
          kernels::cuda::AdamStepList list;
          for (size_t k = first; k < live.size() && list.count < list.kMax; ++k)
            list.index[list.count++] = int32_t(live[k]);
          kernels::cuda::adam_count_steps(list, d->counts.data<int64_t>(), d->values.data<double>(),
                                          d->weight_decay.data<double>(), d->table.data<double>(),
                                          d->last, d->lr.data<double>(), skip,
                                          cuda_stream(d->counts));
        }
      }
    });
  } else if (graph != nullptr) {
    // In a capture the step counts, the learning rate and the values made of them are the
    // replays': each replay counts its step and writes them to the graph's replay slots first.
    for (size_t i : live) {
      RG_CHECK(params_[i].device().is_cuda(), name(), ": parameter ", i, " on ",
               params_[i].device().str(), " in a CUDA graph capture");
      --steps_[i];  // the capture runs nothing
    }
    const Tensor slots = graph->replay_slots(3 * int64_t(live.size()));  // three per parameter
    graph->on_replay([this, live, slots] { write_replay_values(live, slots); });
    for (size_t k = 0; k < live.size(); ++k)
      values[live[k]] = static_cast<const char*>(slots.raw_data()) + 24 * k;
  }
  // All parameters of one device and dtype in one multi-tensor call (a few kernel launches).
  for (const std::vector<size_t>& group : update_groups(params_, live)) {
    const Tensor& lead = params_[group.front()];
    dispatch_on(lead.device(), lead.dtype(), name().c_str(), [&]<class T, class B>() {
      std::vector<kernels::ParamUpdate<T>> updates;
      updates.reserve(group.size());
      for (size_t i : group) {
        Tensor& p = params_[i];
        // (in a capture the launch checks the next replay's step number; the kernel reads the
        // replay's values; with the counts on the device it reads theirs)
        const int64_t step = d != nullptr ? 1 : graph != nullptr ? steps_[i] + 1 : steps_[i];
        updates.push_back({p.data<T>(), p.grad().data<T>(), m_[i].data<T>(), v_[i].data<T>(),
                           p.numel(), weight_decay(i), false, step, values[i]});
        if (d != nullptr) {
          updates.back().device_values = d->values.data<double>() + 3 * i;
          if (skip_if != nullptr) updates.back().skip_if = skip_if->data<float>();
        }
      }
      kernels::Optim<B>::adam_step_many(updates.data(), int64_t(updates.size()), a,
                                        kernel_ctx(lead));
    });
    for (size_t i : group) params_[i].bump_version();
  }
}

// One replay's step of the captured Adam::step (engine/cuda/graph.h's on_replay): each parameter
// counts it, and its three values, computed as adam_step_many computes them on the host (with the
// learning rate of now), go to its 24 bytes of the replay slots, in one copy from pinned memory.
void Adam::write_replay_values(const std::vector<size_t>& live, const Tensor& slots) {
  Tensor host = Tensor::empty_pinned(slots.shape(), slots.dtype());
  char* out = static_cast<char*>(host.raw_data());
  for (size_t k = 0; k < live.size(); ++k) {
    const size_t i = live[k];
    ++steps_[i];
    const double bc1 = 1.0 - std::pow(options_.beta1, double(steps_[i]));
    const double bc2 = 1.0 - std::pow(options_.beta2, double(steps_[i]));
    const double v[3] = {lr_ / bc1, 1.0 / std::sqrt(bc2), 1.0 - lr_ * weight_decay(i)};
    if (params_[i].dtype() == DType::f64) {
      std::memcpy(out + 24 * k, v, sizeof(v));
    } else {  // f32, f16, bf16 compute in f32
      const float f[3] = {float(v[0]), float(v[1]), float(v[2])};
      std::memcpy(out + 24 * k, f, sizeof(f));
    }
  }
  Tensor(slots).copy_(host, /*non_blocking=*/true);
}

NamedTensors Adam::state() const {
  NamedTensors out;
  const std::vector<int64_t> steps = step_counts();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (steps[i] == 0) continue;
    const std::string prefix = std::to_string(i) + ".";
    out.emplace_back(prefix + "exp_avg", m_[i]);
    out.emplace_back(prefix + "exp_avg_sq", v_[i]);
    out.emplace_back(prefix + "step", full({}, double(steps[i]), DType::i64));
  }
  return out;
}

void Adam::clear_state() {
  on_device_.reset();  // the counts are the host's again (a graph using these is dropped)
  for (size_t i = 0; i < params_.size(); ++i) {
    m_[i] = Tensor();
    v_[i] = Tensor();
    steps_[i] = 0;
  }
}

bool Adam::restore_state(size_t index, const std::string& key, const Tensor& value) {
  if (key == "exp_avg") {
    m_[index] = state_like(index, key, value);
  } else if (key == "exp_avg_sq") {
    v_[index] = state_like(index, key, value);
  } else if (key == "step") {
    RG_CHECK(value.defined() && value.numel() == 1, name(), ".load_state: step of parameter ",
             index, " must hold one number");
    const double s = value.item();
    RG_CHECK(s >= 1 && s == std::floor(s), name(), ".load_state: step of parameter ", index, " is ",
             s, ", expected a positive integer");
    steps_[index] = int64_t(s);
  } else {
    return false;
  }
  return true;
}

void Adam::check_state() const {
  for (size_t i = 0; i < params_.size(); ++i) {
    const int have = int(m_[i].defined()) + int(v_[i].defined()) + int(steps_[i] > 0);
    RG_CHECK(have == 0 || have == 3, name(), ".load_state: parameter ", i,
             " needs exp_avg, exp_avg_sq and step together");
  }
}

std::unique_ptr<Optimizer> make_adamw(std::vector<Tensor> params, AdamOptions options) {
  return std::make_unique<Adam>(std::move(params), options, /*decoupled_weight_decay=*/true);
}

std::unique_ptr<Optimizer> make_adamw(std::vector<ParamGroup> groups, AdamOptions options) {
  return std::make_unique<Adam>(std::move(groups), options, /*decoupled_weight_decay=*/true);
}

}  // namespace rg::optim
