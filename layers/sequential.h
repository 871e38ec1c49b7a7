// Sequential: runs its children in order; children are named "0", "1", ... like torch.
#pragma once

#include <memory>
#include <vector>

#include "layers/module.h"

namespace rg::nn {

class Sequential final : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    layers_.push_back(m);
    return register_module(std::to_string(layers_.size() - 1), std::move(m));
  }
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "Sequential"; }
  size_t size() const { return layers_.size(); }
  Module& operator[](size_t i) { return *layers_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

}  // namespace rg::nn
