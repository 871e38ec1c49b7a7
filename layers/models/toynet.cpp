// ToyNet forward, written out like the PyTorch example's forward().
#include "layers/models/toynet.h"

#include "engine/ops/activation.h"
#include "engine/ops/flatten.h"
#include "engine/ops/pool.h"

namespace rg::nn {

ToyNet::ToyNet(Generator& gen, std::shared_ptr<Generator> dropout_gen, bool dropout) {
  conv1 =
      register_module("conv1", std::make_shared<Conv2d>(1, 32, std::array<int64_t, 2>{3, 3}, gen));
  conv2 =
      register_module("conv2", std::make_shared<Conv2d>(32, 64, std::array<int64_t, 2>{3, 3}, gen));
  const auto make_dropout = [&](double p) {
    if (!dropout) p = 0.0;
    return dropout_gen ? std::make_shared<Dropout>(p, dropout_gen) : std::make_shared<Dropout>(p);
  };
  dropout1 = register_module("dropout1", make_dropout(0.25));
  dropout2 = register_module("dropout2", make_dropout(0.5));
  fc1 = register_module("fc1", std::make_shared<Linear>(9216, 128, gen));
  fc2 = register_module("fc2", std::make_shared<Linear>(128, 10, gen));
}

Tensor ToyNet::forward_impl(const Tensor& x) {
  Tensor h = relu(conv1->forward(x));
  h = relu(conv2->forward(h));
  h = max_pool2d(h, {2, 2});
  h = dropout1->forward(h);
  h = flatten(h, 1);
  h = relu(fc1->forward(h));
  h = dropout2->forward(h);
  return fc2->forward(h);
}

}  // namespace rg::nn
