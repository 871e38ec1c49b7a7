// How ops record themselves: SavedTensor (with in-place modification checks) and FunctionNode,
// whose backward is a lambda written next to the op's forward.
#pragma once

#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"

namespace rg::autograd {

// A tensor kept for backward. Unpacking checks that nobody modified it in place since.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  Tensor get() const;

 private:
  Tensor tensor_;
  uint64_t version_ = 0;
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

// A node whose backward is `fn`. Releasing it drops fn and whatever fn captured (saved tensors),
// so a second backward through it reports the freed graph instead of computing garbage.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  void release_saved() override { fn_ = nullptr; }

 private:
  std::string name_;
  BackwardFn fn_;
};

// True when grad mode is on and any input requires grad: the op must record a node.
bool needs_grad(std::initializer_list<Tensor> inputs);
bool needs_grad(std::span<const Tensor> inputs);

// Records `out` as the result of a FunctionNode over `inputs` when needs_grad(inputs).
// The returned tensor is `out` itself (requires_grad set, grad_fn attached).
Tensor record(Tensor out, const char* name, std::initializer_list<Tensor> inputs, BackwardFn fn);
// The same over any number of inputs (gather's parts).
Tensor record(Tensor out, const char* name, std::span<const Tensor> inputs, BackwardFn fn);

}  // namespace rg::autograd
