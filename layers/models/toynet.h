// ToyNet: the CNN of PyTorch's MNIST example (examples/mnist/main.py), same layer names.
#pragma once

#include <memory>

#include "engine/generator.h"
#include "layers/activation.h"
#include "layers/conv2d.h"
#include "layers/linear.h"

namespace rg::nn {

// conv 1->32 3x3, relu, conv 32->64 3x3, relu, max-pool 2, dropout 0.25, flatten,
// fc 9216->128, relu, dropout 0.5, fc 128->10. Returns logits (use cross_entropy).
class ToyNet final : public Module {
 public:
  // dropout = false builds the same network without dropout (for exact equivalence tests).
  ToyNet(Generator& init_gen, std::shared_ptr<Generator> dropout_gen, bool dropout = true);
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "ToyNet"; }

  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<Dropout> dropout1, dropout2;
  std::shared_ptr<Linear> fc1, fc2;
};

}  // namespace rg::nn
