// BatchNorm2d with torchvision's parameter and buffer names (weight, bias, running_mean,
// running_var, num_batches_tracked) and PyTorch's momentum/eps defaults.
#pragma once

#include "layers/module.h"

namespace rg::nn {

class BatchNorm2d final : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1);
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "BatchNorm2d"; }
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 protected:
  std::string extra_repr() const override;

 private:
  int64_t features_;
  double eps_, momentum_;
};

}  // namespace rg::nn
