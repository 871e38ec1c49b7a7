// MLP: flatten, then Linear+ReLU per hidden size, then a Linear to the classes (fc1, fc2, ...).
#pragma once

#include <memory>
#include <vector>

#include "engine/generator.h"
#include "layers/linear.h"

namespace rg::nn {

class MLP final : public Module {
 public:
  MLP(int64_t in_features, std::vector<int64_t> hidden, int64_t num_classes, Generator& gen);
  // Initialized from default_generator() (seed it with rg::manual_seed).
  MLP(int64_t in_features, std::vector<int64_t> hidden, int64_t num_classes)
      : MLP(in_features, std::move(hidden), num_classes, default_generator()) {}
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "MLP"; }

 private:
  std::vector<std::shared_ptr<Linear>> layers_;
};

}  // namespace rg::nn
