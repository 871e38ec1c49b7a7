// Linear: y = x W^T + b with W [out, in] (PyTorch layout and default initialization).
#pragma once

#include "engine/generator.h"
#include "layers/module.h"

namespace rg::nn {

class Linear final : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Generator& gen, bool bias = true);
  // Initialized from default_generator() (seed it with rg::manual_seed).
  Linear(int64_t in_features, int64_t out_features, bool bias = true)
      : Linear(in_features, out_features, default_generator(), bias) {}
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "Linear"; }
  Tensor weight, bias;

 protected:
  std::string extra_repr() const override;

 private:
  int64_t in_, out_;
};

}  // namespace rg::nn
