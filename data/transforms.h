// Per-sample transforms. Pure functions of their inputs, so a run's data is identical for any
// number of loader threads.
#pragma once

#include <cstdint>
#include <vector>

namespace rg::data {

// x = (x - mean[c]) / std[c] on a [C, plane] sample; a single mean/std applies to all channels.
struct Normalize {
  std::vector<float> mean;
  std::vector<float> std;

  void apply(float* sample, int64_t channels, int64_t plane) const;
};

}  // namespace rg::data
