// Builds a model by name for a dataset's sample shape and class count, seeded reproducibly.
#pragma once

#include <memory>
#include <string>

#include "layers/module.h"

namespace rg::nn {

// What make_model builds. The models take their initial weights from Generator(seed), never from
// default_generator(), so the same spec gives the same weights in every process (DDP ranks).
struct ModelSpec {
  // "toynet": the PyTorch MNIST example's CNN (ToyNet); needs sample_shape {1, 28, 28} and
  //   num_classes 10.
  // "mlp": MLP flatten -> fc1 (numel(sample_shape) -> 512) -> ReLU -> fc2 (512 -> 256) -> ReLU ->
  //   fc3 (256 -> num_classes), e.g. 784-512-256-10 on MNIST; any sample shape.
  // "resnet18": ResNet18 with the CIFAR stem (3x3 conv, stride 1, no max-pool); needs 3-channel
  //   samples {3, H, W}. "resnet18-imagenet": the same with the ImageNet stem (7x7 conv, stride 2,
  //   3x3 max-pool).
  // "gpt-nano", "gpt-micro", "gpt-mini": minGPT (layers/models/gpt.h) over token ids; needs
  //   sample_shape {block_size} and num_classes = the vocabulary size (the text dataset's).
  // Any other name is an rg::Error listing these.
  std::string name;
  Shape sample_shape;        // one sample without the batch dimension, e.g. {1, 28, 28}
  int64_t num_classes = 10;  // the last Linear's outputs (toynet: must be 10)
  // Parameter init draws from Generator(seed); toynet's dropout masks from a second Generator whose
  // seed is derived from it (seed ^ 0xD1B54A32D192ED03), shared by its two dropout layers.
  uint64_t seed = 1;
  // toynet only: false sets both dropout layers' p to 0 (they stay in the model, with their names),
  // so training is deterministic for exact comparisons. mlp and resnet18 have no dropout and ignore
  // it.
  bool dropout = true;
  // gpt-*: minGPT's embedding, residual and attention dropout of 0.1 (0 without `dropout`), and a
  // head tied to the token embedding when set.
  bool tie_weights = false;
};

// Builds spec.name for spec's sample shape and classes, checking the shape up front (rg::Error
// naming the model and the shape) so a wrong model/dataset pair fails before training.
std::shared_ptr<Module> make_model(const ModelSpec& spec);

}  // namespace rg::nn
