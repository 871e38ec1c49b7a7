// nn::Module: named parameters, buffers and child modules in registration order, train/eval,
// device/dtype moves, and state_dict with torchvision-compatible dotted names.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/hooks.h"
#include "engine/tensor.h"

namespace rg::nn {

// What load_state_dict did not match, as torch's _IncompatibleKeys.
struct IncompatibleKeys {
  std::vector<std::string> missing_keys;     // the module's keys the state lacks
  std::vector<std::string> unexpected_keys;  // the state's keys the module lacks
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Hooks as PyTorch's (torch.nn.Module.register_*hook). A module's forward takes one tensor, so
  // a forward hook sees that input; the backward hooks see one-element vectors (grad_input[0]) as
  // PyTorch's tuples. Every hook may return nothing (void or std::nullopt) to only observe, or a
  // replacement. Hooks run in registration order, each seeing the previous one's replacement.
  // Backward hooks capture the module by reference: it must outlive the backward pass.
  //
  // Before forward_impl: fn(module, input); a returned Tensor replaces the input.
  using ForwardPreHook = std::function<std::optional<Tensor>(Module&, const Tensor& input)>;
  // After forward_impl: fn(module, input, output); a returned Tensor replaces the output.
  using ForwardHook =
      std::function<std::optional<Tensor>(Module&, const Tensor& input, const Tensor& output)>;
  // When backward has computed the gradient w.r.t. the module's input: fn(module, grad_input,
  // grad_output); a returned vector (same sizes and shapes) replaces grad_input. When the input
  // does not require grad, grad_input is {undefined} and the hook runs once grad_output is known
  // (it may not return a replacement then).
  using BackwardHook = std::function<std::optional<std::vector<Tensor>>(
      Module&, const std::vector<Tensor>& grad_input, const std::vector<Tensor>& grad_output)>;
  // When backward has computed the gradient w.r.t. the module's output, before the module's own
  // backward: fn(module, grad_output); a returned vector replaces grad_output.
  using BackwardPreHook = std::function<std::optional<std::vector<Tensor>>(
      Module&, const std::vector<Tensor>& grad_output)>;

  // Runs the forward pre-hooks, forward_impl and the forward hooks; with backward hooks (and grad
  // mode on) it wraps the input and output in identity nodes that call them, as PyTorch's
  // BackwardHook. Every call runs the hooks: a parent's forward_impl calls its children's
  // forward() (Sequential, the models). While tracing, the module's dotted path names the
  // autograd nodes it creates (their backward spans) and a "module" span covers its forward.
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  template <class F>
  RemovableHandle register_forward_pre_hook(F fn) {
    return forward_pre_hooks_.add(
        optional_result_hook<Tensor, Module&, const Tensor&>(std::move(fn)));
  }
  template <class F>
  RemovableHandle register_forward_hook(F fn) {
    return forward_hooks_.add(
        optional_result_hook<Tensor, Module&, const Tensor&, const Tensor&>(std::move(fn)));
  }
  template <class F>
  RemovableHandle register_full_backward_hook(F fn) {
    return backward_hooks_.add(
        optional_result_hook<std::vector<Tensor>, Module&, const std::vector<Tensor>&,
                             const std::vector<Tensor>&>(std::move(fn)));
  }
  template <class F>
  RemovableHandle register_full_backward_pre_hook(F fn) {
    return backward_pre_hooks_.add(
        optional_result_hook<std::vector<Tensor>, Module&, const std::vector<Tensor>&>(
            std::move(fn)));
  }

  // "layer1.0.conv1": the names from the root module down; "" for a module nobody registered.
  std::string path() const;
  // The class name shown when printing ("Conv2d", "ToyNet").
  virtual std::string type_name() const = 0;

  // Recursive, "layer1.0.conv1.weight"; a tensor registered in two modules (a tied weight) is
  // listed once, under its first name (PyTorch's remove_duplicate), as is parameters().
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;  // recursive
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const {
    return children_;
  }
  // This module ("") and all descendants, depth first, in registration order.
  std::vector<std::pair<std::string, Module*>> named_modules();
  int64_t parameter_count() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Converts every parameter and floating-point buffer in place (handles stay valid, so
  // optimizers built before keep working). Integer buffers keep their dtype.
  void to(Device device);
  void to(DType dtype);
  // Every 4-d parameter and buffer (convolution weights) into `format`, in place, as PyTorch's
  // module.to(memory_format=...): a channels_last model takes channels_last batches without a
  // layout conversion per step. Gradients follow their parameter's format.
  void to(MemoryFormat format);
  void zero_grad(bool set_to_none = true);

  // Parameters then buffers of each module, in registration order, like PyTorch's state_dict.
  NamedTensors state_dict() const;
  // Copies values in, as torch's load_state_dict. With strict, names must match exactly: missing
  // and unexpected keys, shape and dtype-kind mismatches are reported together in one rg::Error
  // worded like PyTorch's ("Error(s) in loading state_dict for MLP: Missing key(s) in state_dict:
  // ..."), and nothing changes. Without strict, the keys present in both are copied and the others
  // returned; shape and dtype-kind mismatches still throw (as in PyTorch).
  IncompatibleKeys load_state_dict(const NamedTensors& state, bool strict = true);

  std::string str() const;  // PyTorch-like module tree
  // A torchinfo-like table without running the model: one row per module (depth first, indented
  // by depth) with its type, its own parameters' shapes and their element count, then the totals
  // of trainable and frozen (requires_grad false) parameter elements, buffer elements, and the
  // bytes they all take.
  std::string summary() const;
  // The same table with an "output shape" column, like torchinfo.summary(model, input_size): runs
  // one forward pass on zeros of `input_shape` (batch dimension included, e.g. {1, 1, 28, 28}), on
  // the device and dtype of the first parameter, in eval mode without grad, recording every
  // module's output shape with forward hooks (a module called twice shows its last call). Each
  // module's train/eval mode is restored afterwards, and the hooks removed.
  std::string summary(const Shape& input_shape);

  // Public, as in PyTorch, so that a network gets its names (conv1, fc1, ...) without a subclass.
  // `name` is one path component (no '.') unique among this module's parameters, buffers and
  // children. The returned tensor shares storage with the registered one; the reference is valid
  // only until the next registration (hold a Tensor copy, as the layers do).
  Tensor& register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor t);
  // Makes the registered parameter `name` the tensor t (same shape), as PyTorch's
  // `lm_head.weight = wte.weight`: weight tying. The module's own member (Linear::weight) must be
  // set to t as well.
  Tensor& replace_parameter(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

 protected:
  virtual std::string extra_repr() const { return ""; }
  // What the module computes; subclasses implement this (users call forward()).
  virtual Tensor forward_impl(const Tensor& x) = 0;
  // For a module's fused forward (BatchNorm2d::forward_relu): whether any hook is registered on
  // it (a hook must see the unfused output, so the caller then goes through forward()), and f(x)
  // run as forward() runs forward_impl (named on the trace, inside a "module" span).
  bool has_hooks() const;
  Tensor traced_call(const Tensor& x, const std::function<Tensor(const Tensor&)>& f);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, bool params, bool buffers, NamedTensors& out) const;
  void str_into(std::string& out, int indent) const;
  // summary()'s table; `output_shape` (a module's, as text) adds that column when given.
  std::string summary_table(const std::function<std::string(const Module&)>& output_shape) const;
  Tensor run_forward_pre_hooks(Tensor input);
  Tensor run_forward_hooks(const Tensor& input, Tensor output);
  Tensor traced_forward_impl(const Tensor& x);

  const Module* parent_ = nullptr;  // set when registered as a child
  std::string local_name_;
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  HookList<ForwardPreHook> forward_pre_hooks_;
  HookList<ForwardHook> forward_hooks_;
  HookList<BackwardHook> backward_hooks_;
  HookList<BackwardPreHook> backward_pre_hooks_;
};

// Replaces t's contents (storage, dtype) in place with `value`'s, keeping autograd flags.
void assign_in_place(const Tensor& t, const Tensor& value);

}  // namespace rg::nn
