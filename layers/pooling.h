// Pooling modules: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d (1x1 output).
#pragma once

#include <array>

#include "layers/module.h"

namespace rg::nn {

class MaxPool2d final : public Module {
 public:
  // stride {0, 0} means stride = kernel, as in PyTorch.
  explicit MaxPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                     std::array<int64_t, 2> padding = {0, 0});
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "MaxPool2d"; }

 private:
  std::array<int64_t, 2> kernel_, stride_, padding_;
};

class AvgPool2d final : public Module {
 public:
  explicit AvgPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                     std::array<int64_t, 2> padding = {0, 0});
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "AvgPool2d"; }

 private:
  std::array<int64_t, 2> kernel_, stride_, padding_;
};

class AdaptiveAvgPool2d final : public Module {
 public:
  explicit AdaptiveAvgPool2d(std::array<int64_t, 2> output_size = {1, 1}) : output_(output_size) {}
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }

 private:
  std::array<int64_t, 2> output_;
};

}  // namespace rg::nn
