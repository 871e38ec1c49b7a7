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
  // A square kernel, as torch.nn.Conv2d(1, 32, 3) or Conv2d(64, 128, 3, 2, 1): kernel_size x
  // kernel_size, the same stride and padding in both dimensions, from default_generator().
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         int64_t padding = 0, bool bias = true)
      : Conv2d(in_channels, out_channels, {kernel_size, kernel_size},
               Conv2dOptions{
                   .stride = {stride, stride}, .padding = {padding, padding}, .bias = bias}) {}
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
