// Module::forward with PyTorch's module hooks: forward pre-hooks and hooks around forward_impl,
// and full backward (pre-)hooks through identity nodes on the input and output, as
// torch.utils.hooks.BackwardHook does.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/trace.h"
#include "kernels/error.h"
#include "layers/module.h"

namespace rg::nn {
namespace {

// What a hook returned in place of `current` (gradients, by position): same count, and each
// defined one of the same shape as the one it replaces.
std::vector<Tensor> checked_gradients(std::vector<Tensor> replaced,
                                      const std::vector<Tensor>& current, const Module& m,
                                      const char* hook, const char* what) {
  RG_CHECK(replaced.size() == current.size(), m.type_name(), ": a ", hook, " returned ",
           replaced.size(), " gradients for ", current.size(), " ", what);
  for (size_t i = 0; i < replaced.size(); ++i) {
    RG_CHECK(!replaced[i].defined() || !current[i].defined() ||
                 replaced[i].shape() == current[i].shape(),
             m.type_name(), ": a ", hook, " returned a gradient of shape ",
             shape_str(replaced[i].shape()), " for ", what, "[", i, "] of shape ",
             shape_str(current[i].shape()));
  }
  return replaced;
}

// One call's backward hooks (the hooks registered when the forward ran). The output's identity
// node runs first in backward: it runs the pre-hooks and keeps grad_output; the input's identity
// node runs once the module's whole backward is done and calls the hooks with grad_input.
class BackwardHookCall {
 public:
  BackwardHookCall(Module& m, std::vector<Module::BackwardHook> hooks,
                   std::vector<Module::BackwardPreHook> pre_hooks)
      : module_(m), hooks_(std::move(hooks)), pre_hooks_(std::move(pre_hooks)) {}

  static Tensor wrap_input(const std::shared_ptr<BackwardHookCall>& call, const Tensor& input) {
    if (!autograd::needs_grad({input})) return input;
    call->input_wrapped_ = true;
    return autograd::record(input.detach(), "BackwardHookFunctionBackward", {input},
                            [call](const Tensor& g) { return call->on_grad_input({g}); });
  }

  static Tensor wrap_output(const std::shared_ptr<BackwardHookCall>& call, const Tensor& output) {
    if (!autograd::needs_grad({output})) return output;
    return autograd::record(output.detach(), "BackwardHookFunctionBackward", {output},
                            [call](const Tensor& g) { return call->on_grad_output({g}); });
  }

 private:
  std::vector<Tensor> on_grad_output(std::vector<Tensor> grad_output) {
    for (const auto& hook : pre_hooks_) {
      if (auto r = hook(module_, grad_output)) {
        grad_output = checked_gradients(std::move(*r), grad_output, module_,
                                        "full backward pre-hook", "grad_output");
      }
    }
    if (input_wrapped_) {
      grad_output_ = grad_output;
    } else {
      // No input needs a gradient: there is no input node to wait for (PyTorch does the same).
      const std::vector<Tensor> grad_input(1);
      for (const auto& hook : hooks_) {
        const auto r = hook(module_, grad_input, grad_output);
        RG_CHECK(
            !r || std::none_of(r->begin(), r->end(), [](const Tensor& t) { return t.defined(); }),
            module_.type_name(),
            ": a full backward hook returned a grad_input, but no "
            "input of the module requires grad; return nothing");
      }
    }
    return grad_output;
  }

  std::vector<Tensor> on_grad_input(std::vector<Tensor> grad_input) {
    for (const auto& hook : hooks_) {
      if (auto r = hook(module_, grad_input, grad_output_)) {
        grad_input = checked_gradients(std::move(*r), grad_input, module_, "full backward hook",
                                       "grad_input");
      }
    }
    grad_output_.clear();
    return grad_input;
  }

  Module& module_;
  std::vector<Module::BackwardHook> hooks_;
  std::vector<Module::BackwardPreHook> pre_hooks_;
  bool input_wrapped_ = false;
  std::vector<Tensor> grad_output_;
};

}  // namespace

Tensor Module::forward(const Tensor& x) {
  Tensor input = run_forward_pre_hooks(x);
  std::shared_ptr<BackwardHookCall> backward_call;
  if (GradMode::is_enabled() && !(backward_hooks_.empty() && backward_pre_hooks_.empty())) {
    backward_call = std::make_shared<BackwardHookCall>(*this, backward_hooks_.snapshot(),
                                                       backward_pre_hooks_.snapshot());
    input = BackwardHookCall::wrap_input(backward_call, input);
  }
  Tensor output = run_forward_hooks(input, traced_forward_impl(input));
  return backward_call ? BackwardHookCall::wrap_output(backward_call, output) : output;
}

Tensor Module::run_forward_pre_hooks(Tensor input) {
  if (forward_pre_hooks_.empty()) return input;
  for (const ForwardPreHook& hook : forward_pre_hooks_.snapshot()) {
    if (auto r = hook(*this, input)) {
      RG_CHECK(r->defined(), type_name(), ": a forward pre-hook returned an undefined input");
      input = std::move(*r);
    }
  }
  return input;
}

Tensor Module::run_forward_hooks(const Tensor& input, Tensor output) {
  if (forward_hooks_.empty()) return output;
  for (const ForwardHook& hook : forward_hooks_.snapshot()) {
    if (auto r = hook(*this, input, output)) {
      RG_CHECK(r->defined(), type_name(), ": a forward hook returned an undefined output");
      output = std::move(*r);
    }
  }
  return output;
}

Tensor Module::traced_forward_impl(const Tensor& x) {
  return traced_call(x, [this](const Tensor& in) { return forward_impl(in); });
}

Tensor Module::traced_call(const Tensor& x, const std::function<Tensor(const Tensor&)>& f) {
  if (!trace::enabled()) return f(x);
  std::string name = path();
  if (name.empty()) name = type_name();
  trace::NameScope scope(name);
  const auto t0 = trace::Clock::now();
  Tensor y = f(x);
  trace::span(std::move(name), "module", t0, trace::Clock::now());
  return y;
}

bool Module::has_hooks() const {
  return !(forward_pre_hooks_.empty() && forward_hooks_.empty() && backward_hooks_.empty() &&
           backward_pre_hooks_.empty());
}

}  // namespace rg::nn
