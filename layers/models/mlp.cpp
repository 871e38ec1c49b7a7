// MLP.
#include "layers/models/mlp.h"

#include "engine/ops/activation.h"
#include "engine/ops/flatten.h"

namespace rg::nn {

MLP::MLP(int64_t in_features, std::vector<int64_t> hidden, int64_t num_classes, Generator& gen) {
  int64_t in = in_features;
  hidden.push_back(num_classes);
  for (size_t i = 0; i < hidden.size(); ++i) {
    layers_.push_back(register_module("fc" + std::to_string(i + 1),
                                      std::make_shared<Linear>(in, hidden[i], gen)));
    in = hidden[i];
  }
}

Tensor MLP::forward_impl(const Tensor& x) {
  Tensor h = x.dim() > 2 ? flatten(x, 1) : x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    h = layers_[i]->forward(h);
    if (i + 1 < layers_.size()) h = relu(h);
  }
  return h;
}

}  // namespace rg::nn
