// Builds a dataset by name: mnist, fashion-mnist (IDX files in a directory) or synthetic-<shape>.
#pragma once

#include <memory>
#include <string>

#include "data/dataset.h"

namespace rg::data {

// `synthetic` gives 1x28x28 / 10 classes (MNIST-like), `synthetic-cifar` 3x32x32 / 10 classes.
std::shared_ptr<const Dataset> make_dataset(const std::string& name, const std::string& dir,
                                            bool train);

}  // namespace rg::data
