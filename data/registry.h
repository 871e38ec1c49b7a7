// Builds a dataset by name: mnist, fashion-mnist (IDX files in a directory), cifar10, cifar100
// (binary files in a directory), synthetic-<shape>, or text (a character-level UTF-8 text file,
// data/text.h: options.data_file, options.block_size, options.val_fraction).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/dataset.h"

namespace rg::data {

struct DatasetOptions {
  bool augment = false;  // training sets of cifar10/cifar100: random crop (padding 4) and flip
  uint64_t seed = 0;     // of the augmentation draws
  // text: the UTF-8 file, the block (context) length and the fraction kept for validation.
  std::string data_file{};  // (braces: designated initializers may leave it out)
  int64_t block_size = 128;
  double val_fraction = 0.1;
};

// `synthetic` gives 1x28x28 / 10 classes (MNIST-like), `synthetic-cifar` 3x32x32 / 10 classes.
// `text` ignores `dir`; train=false gives its validation split.
std::shared_ptr<const Dataset> make_dataset(const std::string& name, const std::string& dir,
                                            bool train, const DatasetOptions& options = {});

}  // namespace rg::data
