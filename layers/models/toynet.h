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
  // dropout = false builds the same network with p = 0 in both dropout layers (same modules and
  // names; for exact equivalence tests). A null dropout_gen draws the masks from
  // default_generator(), as torch.nn.Dropout.
  ToyNet(Generator& init_gen, std::shared_ptr<Generator> dropout_gen = nullptr,
         bool dropout = true);
  // Initialized from default_generator() (seed it with rg::manual_seed), which also draws the
  // dropout masks: ToyNet net; as the PyTorch example's Net().
  explicit ToyNet(bool dropout = true) : ToyNet(default_generator(), nullptr, dropout) {}
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "ToyNet"; }

  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<Dropout> dropout1, dropout2;
  std::shared_ptr<Linear> fc1, fc2;
};

}  // namespace rg::nn
