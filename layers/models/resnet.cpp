// ResNet-18 (He et al. 2016) as torchvision builds it: BasicBlock x [2, 2, 2, 2].
#include "layers/models/resnet.h"

#include <utility>

#include "engine/ops/activation.h"
#include "engine/ops/binary.h"
#include "engine/ops/flatten.h"
#include "engine/ops/pool.h"
#include "layers/init.h"

namespace rg::nn {
namespace {

std::shared_ptr<Conv2d> conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad,
                             Generator& gen) {
  auto c = std::make_shared<Conv2d>(
      in, out, std::array<int64_t, 2>{k, k}, gen,
      Conv2dOptions{.stride = {stride, stride}, .padding = {pad, pad}, .bias = false});
  // torchvision: kaiming_normal_(mode="fan_out", nonlinearity="relu") for every conv.
  init::kaiming_normal_fan_out_(c->weight, gen);
  return c;
}

}  // namespace

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride, Generator& gen) {
  conv1_ = register_module("conv1", conv(in_planes, planes, 3, stride, 1, gen));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(planes));
  conv2_ = register_module("conv2", conv(planes, planes, 3, 1, 1, gen));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
  if (stride != 1 || in_planes != planes) {
    downsample_ = register_module("downsample", std::make_shared<Sequential>());
    downsample_->push_back(conv(in_planes, planes, 1, stride, 0, gen));
    downsample_->push_back(std::make_shared<BatchNorm2d>(planes));
  }
}

Tensor BasicBlock::forward_impl(const Tensor& x) {
  Tensor out = conv2_->forward(bn1_->forward_relu(conv1_->forward(x)));
  const Tensor identity = downsample_ ? downsample_->forward(x) : x;
  // bn2, the shortcut's add and relu in one op (unfused: the sum and relu written over bn2's
  // output, torchvision's in-place `out += identity; relu(out)`). So bn2 runs after the
  // downsample branch, where torchvision runs it before; the values are the same.
  return bn2_->forward_add_relu(out, identity);
}

ResNet18::ResNet18(int64_t num_classes, Generator& gen, bool imagenet_stem)
    : imagenet_stem_(imagenet_stem) {
  conv1_ = register_module("conv1",
                           imagenet_stem ? conv(3, 64, 7, 2, 3, gen) : conv(3, 64, 3, 1, 1, gen));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(64));
  const int64_t planes[4] = {64, 128, 256, 512};
  int64_t in = 64;
  for (int i = 0; i < 4; ++i) {
    auto layer = std::make_shared<Sequential>();
    const int64_t stride = i == 0 ? 1 : 2;
    layer->push_back(std::make_shared<BasicBlock>(in, planes[i], stride, gen));
    layer->push_back(std::make_shared<BasicBlock>(planes[i], planes[i], 1, gen));
    in = planes[i];
    layers_[i] = register_module("layer" + std::to_string(i + 1), layer);
  }
  fc_ = register_module("fc", std::make_shared<Linear>(512, num_classes, gen));
}

Tensor ResNet18::forward_impl(const Tensor& x) {
  Tensor h = bn1_->forward_relu(conv1_->forward(x));
  if (imagenet_stem_) h = max_pool2d(h, {3, 3}, {2, 2}, {1, 1});
  for (auto& layer : layers_) h = layer->forward(h);
  h = flatten(adaptive_avg_pool2d(h, {1, 1}), 1);
  return fc_->forward(h);
}

}  // namespace rg::nn
