// Where the e2e tests find the real MNIST files: $RG_MNIST_DIR, else data/mnist in the source
// tree (scripts/get-data.sh mnist puts them there; scripts/test.sh fetches them). Needs
// RG_SOURCE_DIR defined by the test target.
#pragma once

#include <cstdlib>
#include <string>

namespace rg::testing {

inline std::string mnist_dir() {
  if (const char* d = std::getenv("RG_MNIST_DIR")) return d;
  return std::string(RG_SOURCE_DIR) + "/data/mnist";
}

}  // namespace rg::testing
