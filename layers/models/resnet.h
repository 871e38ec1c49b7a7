// ResNet-18 with torchvision's module names (conv1, bn1, layer1.0.conv1, ..., fc) and init.
// CIFAR stem (default): 3x3 conv stride 1, no max-pool. ImageNet stem: 7x7 stride 2 + max-pool.
#pragma once

#include <memory>

#include "engine/generator.h"
#include "layers/batch_norm.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/sequential.h"

namespace rg::nn {

class BasicBlock final : public Module {
 public:
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride, Generator& gen);
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "BasicBlock"; }

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<Sequential> downsample_;  // null when the shapes already match
};

class ResNet18 final : public Module {
 public:
  ResNet18(int64_t num_classes, Generator& gen, bool imagenet_stem = false);
  // Initialized from default_generator() (seed it with rg::manual_seed).
  explicit ResNet18(int64_t num_classes = 10, bool imagenet_stem = false)
      : ResNet18(num_classes, default_generator(), imagenet_stem) {}
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "ResNet18"; }

 private:
  bool imagenet_stem_;
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
  std::shared_ptr<Sequential> layers_[4];
  std::shared_ptr<Linear> fc_;
};

}  // namespace rg::nn
