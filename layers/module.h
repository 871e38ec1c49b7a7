// nn::Module: named parameters, buffers and child modules in registration order, train/eval,
// device/dtype moves, and state_dict with torchvision-compatible dotted names.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

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

  // Runs forward_impl. While tracing, the module's dotted path names the autograd nodes it
  // creates (their backward spans) and a "module" span covers its forward.
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  // "layer1.0.conv1": the names from the root module down; "" for a module nobody registered.
  std::string path() const;
  // The class name shown when printing ("Conv2d", "ToyNet").
  virtual std::string type_name() const = 0;

  NamedTensors named_parameters() const;  // recursive, "layer1.0.conv1.weight"
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

  // Public, as in PyTorch, so that a network gets its names (conv1, fc1, ...) without a subclass.
  // `name` is one path component (no '.') unique among this module's parameters, buffers and
  // children. The returned tensor shares storage with the registered one; the reference is valid
  // only until the next registration (hold a Tensor copy, as the layers do).
  Tensor& register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

 protected:
  virtual std::string extra_repr() const { return ""; }
  // What the module computes; subclasses implement this (users call forward()).
  virtual Tensor forward_impl(const Tensor& x) = 0;

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, bool params, bool buffers, NamedTensors& out) const;
  void str_into(std::string& out, int indent) const;

  const Module* parent_ = nullptr;  // set when registered as a child
  std::string local_name_;
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Replaces t's contents (storage, dtype) in place with `value`'s, keeping autograd flags.
void assign_in_place(const Tensor& t, const Tensor& value);

}  // namespace rg::nn
