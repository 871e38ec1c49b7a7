// Parameter groups by minGPT's rule (configure_optimizers): decay the weights of Linear layers,
// nothing else.
#pragma once

#include <vector>

#include "layers/module.h"
#include "layers/optim/optimizer.h"

namespace rg::optim {

// Two groups over every parameter of `model`, each in model.named_parameters() order:
//   [0] weight_decay: the `weight` of every nn::Linear;
//   [1] 0: everything else (biases, LayerNorm/BatchNorm weights, Embedding weights, ...).
// A parameter reachable under several names (a tied weight) is listed once, at its first name.
// It decays only when every name is a Linear's weight: a Linear weight tied to an Embedding (a
// language model's head and its token embedding) is an embedding and goes in group 1, as minGPT
// and nanoGPT do for lm_head.weight.
std::vector<ParamGroup> linear_weight_decay_groups(const nn::Module& model, double weight_decay);

}  // namespace rg::optim
