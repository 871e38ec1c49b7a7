// Conv2d module (groups = 1) with PyTorch's default initialization.
#pragma once

#include <array>

#include "engine/generator.h"
#include "layers/module.h"

namespace rg::nn {

struct Conv2dOptions {
  std::array<int64_t, 2> stride = {1, 1};
  std::array<int64_t, 2> padding = {0, 0};
  std::array<int64_t, 2> dilation = {1, 1};
  bool bias = true;
};

class Conv2d final : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, std::array<int64_t, 2> kernel, Generator& gen,
         Conv2dOptions options = {});
  // Initialized from default_generator() (seed it with rg::manual_seed).
  Conv2d(int64_t in_channels, int64_t out_channels, std::array<int64_t, 2> kernel,
         Conv2dOptions options = {})
      : Conv2d(in_channels, out_channels, kernel, default_generator(), options) {}
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "Conv2d"; }
  Tensor weight, bias;

 protected:
  std::string extra_repr() const override;

 private:
  int64_t in_, out_;
  std::array<int64_t, 2> kernel_;
  Conv2dOptions options_;
};

}  // namespace rg::nn
