// SavedTensor version checks, FunctionNode and the op-side recording helper.
#include "engine/autograd/function.h"

#include "kernels/error.h"

namespace rg::autograd {

// Detached: a saved output must not own its own grad_fn (that would be a reference cycle).
SavedTensor::SavedTensor(const Tensor& t) : tensor_(t.defined() ? t.detach() : t) {
  if (t.defined()) version_ = t.storage()->version();
}

Tensor SavedTensor::get() const {
  if (tensor_.defined()) {
    RG_CHECK(tensor_.storage()->version() == version_, "a tensor saved for backward (shape ",
             shape_str(tensor_.shape()),
             ") was modified by an in-place operation after it was saved; clone it before "
             "modifying it, or do the modification before the forward pass");
  }
  return tensor_;
}

std::vector<Tensor> FunctionNode::apply(const Tensor& grad_output) {
  RG_CHECK(fn_ != nullptr, "trying to run backward through ", name_,
           " a second time, but its saved tensors were already freed; pass retain_graph=true "
           "to the first backward() if you need to backward through the graph twice");
  return fn_(grad_output);
}

bool needs_grad(std::initializer_list<Tensor> inputs) {
  return needs_grad(std::span<const Tensor>(inputs.begin(), inputs.size()));
}

bool needs_grad(std::span<const Tensor> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

Tensor record(Tensor out, const char* name, std::initializer_list<Tensor> inputs, BackwardFn fn) {
  return record(std::move(out), name, std::span<const Tensor>(inputs.begin(), inputs.size()),
                std::move(fn));
}

Tensor record(Tensor out, const char* name, std::span<const Tensor> inputs, BackwardFn fn) {
  if (!needs_grad(inputs)) return out;
  auto node = std::make_shared<FunctionNode>(name, std::move(fn));
  for (const Tensor& t : inputs) node->add_input(t);
  AutogradMeta& meta = out.autograd_meta();
  meta.requires_grad = true;
  meta.grad_fn = std::move(node);
  return out;
}

}  // namespace rg::autograd
