// Node bookkeeping, leaf accumulation and the edge from a tensor into the graph.
#include "engine/autograd/node.h"

#include <atomic>
#include <limits>

#include "engine/autograd/grad_mode.h"
#include "engine/ops/binary.h"
#include "engine/trace.h"
#include "kernels/error.h"

namespace rg::autograd {
namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
}

Node::Node() : sequence_nr_(g_next_sequence_nr.fetch_add(1)) {
  if (trace::enabled()) scope_ = trace::current_scope();
}

void Node::add_input(const Tensor& input) {
  next_edges_.push_back(Edge{input.defined() ? gradient_edge(input) : nullptr});
  input_shapes_.push_back(input.defined() ? input.shape() : Shape{});
  input_formats_.push_back(input.defined() ? input.memory_format() : MemoryFormat::contiguous);
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {
  sequence_nr_ = std::numeric_limits<uint64_t>::max();
}

Tensor Node::run_tensor_pre_hooks(Tensor grad) {
  grad = run_tensor_hooks(tensor_pre_hooks_, std::move(grad));
  if (retain_grad_hook_) retain_grad_hook_(grad);
  return grad;
}

bool sole_owner(const Tensor& grad, long refs) {
  const TensorImpl& impl = *grad.impl();
  return grad.impl_ptr().use_count() <= refs && impl.storage.use_count() == 1 && impl.offset == 0 &&
         impl.storage->nbytes() == grad.nbytes() && impl.autograd == nullptr;
}

void accumulate_grad(AutogradMeta& meta, const Tensor& grad, bool adopt) {
  NoGradGuard no_grad;
  if (!meta.grad) {
    // A buffer that someone else can still see is copied, so later in-place accumulation into
    // .grad cannot alias it; one that only this pass holds becomes .grad as it is (PyTorch's
    // AccumulateGrad steals it likewise), which saves a copy and a parameter-sized block.
    meta.grad = adopt ? grad.impl_ptr() : grad.clone().impl_ptr();
  } else {
    Tensor g(meta.grad);
    add_(g, grad);
  }
}

Tensor run_tensor_hooks(const HookList<TensorHook>& hooks, Tensor grad) {
  if (hooks.empty()) return grad;
  for (const TensorHook& hook : hooks.snapshot()) {
    std::optional<Tensor> replaced = hook(grad);
    if (!replaced) continue;
    RG_CHECK(replaced->defined() && replaced->shape() == grad.shape() &&
                 replaced->dtype() == grad.dtype(),
             "a tensor hook returned ",
             replaced->defined()
                 ? shape_str(replaced->shape()) + " " + dtype_name(replaced->dtype())
                 : std::string("an undefined tensor"),
             " for a gradient of ", shape_str(grad.shape()), " ", dtype_name(grad.dtype()),
             "; a hook must return a tensor of the same shape and dtype, or nothing to keep it");
    // Kept in the gradient's memory format, which the node after it reads.
    grad = replaced->memory_format() == grad.memory_format()
               ? std::move(*replaced)
               : replaced->detach().contiguous(grad.memory_format());
  }
  return grad;
}

std::vector<Tensor> AccumulateGrad::apply(const Tensor& grad_output) {
  NoGradGuard no_grad;
  AutogradMeta& meta = *leaf_->autograd;
  // The engine passes a temporary that it drops after this call: with no hook replacing it, it
  // is referenced here and there only.
  const Tensor grad = run_tensor_hooks(meta.hooks, grad_output);
  accumulate_grad(meta, grad, sole_owner(grad, grad.is_same(grad_output) ? 2 : 1));
  Tensor leaf(leaf_);
  for (auto& hook : meta.post_accumulate_hooks) hook(leaf);
  return {};
}

std::shared_ptr<Node> gradient_edge(const Tensor& t) {
  TensorImpl* impl = t.impl();
  if (impl->autograd == nullptr) return nullptr;
  AutogradMeta& meta = *impl->autograd;
  if (meta.grad_fn) return meta.grad_fn;
  if (!meta.requires_grad) return nullptr;
  std::shared_ptr<AccumulateGrad> acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    meta.grad_accumulator = acc;
  }
  return acc;
}

}  // namespace rg::autograd
