// LayerNorm over the last dimension (torch.nn.LayerNorm(D, eps, elementwise_affine)): parameters
// `weight` (ones) and `bias` (zeros) of shape [D] when affine, none otherwise.
#pragma once

#include "layers/module.h"

namespace rg::nn {

class LayerNorm final : public Module {
 public:
  explicit LayerNorm(int64_t normalized_size, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "LayerNorm"; }
  Tensor weight, bias;  // undefined without elementwise_affine

 protected:
  std::string extra_repr() const override;

 private:
  int64_t size_;
  double eps_;
  bool affine_;
};

}  // namespace rg::nn
