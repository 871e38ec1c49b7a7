// Builds a model by name for a dataset's sample shape and class count, seeded reproducibly.
#pragma once

#include <memory>
#include <string>

#include "layers/module.h"

namespace rg::nn {

struct ModelSpec {
  std::string name;    // toynet | mlp | resnet18 | resnet18-imagenet
  Shape sample_shape;  // e.g. {1, 28, 28}
  int64_t num_classes = 10;
  uint64_t seed = 1;  // parameter init; dropout uses a stream derived from it
  bool dropout = true;
};

std::shared_ptr<Module> make_model(const ModelSpec& spec);

}  // namespace rg::nn
