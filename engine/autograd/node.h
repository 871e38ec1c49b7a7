// Autograd graph nodes. A Node turns the gradient of its (single) output into gradients of its
// inputs; edges point to the nodes of those inputs. Leaves end in AccumulateGrad.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace rg::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null: that input needs no gradient
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();  // takes the next sequence number
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual std::string name() const = 0;
  // One gradient per input edge (undefined where an input gets none).
  // `grad_output` is the engine's own buffer, which it drops after the call: a node may write
  // over it when nothing else holds it (reusable() in engine/ops/check.h).
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
  // Frees saved tensors after a backward pass that did not ask to retain the graph.
  virtual void release_saved() {}

  // Later nodes run first; AccumulateGrad uses the maximum so leaves finish as soon as ready.
  uint64_t sequence_nr() const { return sequence_nr_; }
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  // Shapes (and dtypes) the gradients of the inputs must have.
  const std::vector<Shape>& input_shapes() const { return input_shapes_; }
  // The inputs' memory formats: the engine hands each input's producer its gradient in the
  // format of that input (converting where a node returned another), so a backward function
  // always receives its output's gradient in its output's format.
  const std::vector<MemoryFormat>& input_formats() const { return input_formats_; }

  void add_input(const Tensor& input);  // appends the edge to input's history
  // The module whose forward created this node (recorded only while tracing), e.g.
  // "layer1.0.conv1".
  const std::string& scope() const { return scope_; }

  // The hooks of the tensor this node produced (Tensor::register_hook on a non-leaf), and what
  // retain_grad() installs; the engine runs them on the incoming gradient before apply().
  HookList<TensorHook>& tensor_pre_hooks() { return tensor_pre_hooks_; }
  void set_retain_grad_hook(std::function<void(const Tensor&)> hook) {
    retain_grad_hook_ = std::move(hook);
  }
  // The tensor hooks, then the retain_grad hook (last, so .grad sees the hooks' result).
  Tensor run_tensor_pre_hooks(Tensor grad);

 protected:
  uint64_t sequence_nr_;

 private:
  std::vector<Edge> next_edges_;
  std::vector<Shape> input_shapes_;
  std::vector<MemoryFormat> input_formats_;
  std::string scope_;
  HookList<TensorHook> tensor_pre_hooks_;
  std::function<void(const Tensor&)> retain_grad_hook_;
};

// Adds `grad` into meta.grad, as a leaf's .grad accumulates. On the first pass meta.grad becomes
// a copy of `grad`, or with `adopt` `grad` itself (the caller knows nobody else holds it).
void accumulate_grad(AutogradMeta& meta, const Tensor& grad, bool adopt = false);

// Whether `grad` can be adopted: at most `refs` handles share its TensorImpl, its storage is
// exactly this tensor and no other tensor uses it, and it carries no autograd state.
bool sole_owner(const Tensor& grad, long refs);

// Runs `hooks` in order on `grad`, each on the previous result; a replacement must keep the shape.
Tensor run_tensor_hooks(const HookList<TensorHook>& hooks, Tensor grad);

// Leaf sink: runs the leaf's tensor hooks, adds the result to leaf.grad, then runs its
// post-accumulate hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// The node that a gradient flowing into `t` goes to: its grad_fn, or its leaf accumulator.
std::shared_ptr<Node> gradient_edge(const Tensor& t);

}  // namespace rg::autograd
