// Builds a dataset by name: mnist, fashion-mnist (IDX files in a directory), cifar10, cifar100
// (binary files in a directory) or synthetic-<shape>.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/dataset.h"

namespace rg::data {

struct DatasetOptions {
  bool augment = false;  // training sets of cifar10/cifar100: random crop (padding 4) and flip
  uint64_t seed = 0;     // of the augmentation draws
};

// `synthetic` gives 1x28x28 / 10 classes (MNIST-like), `synthetic-cifar` 3x32x32 / 10 classes.
std::shared_ptr<const Dataset> make_dataset(const std::string& name, const std::string& dir,
                                            bool train, const DatasetOptions& options = {});

}  // namespace rg::data
