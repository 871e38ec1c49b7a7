// Normalize over channel planes.
#include "data/transforms.h"

#include "kernels/error.h"

namespace rg::data {

void Normalize::apply(float* sample, int64_t channels, int64_t plane) const {
  RG_CHECK(!mean.empty() && mean.size() == std.size(), "Normalize: mean and std must be non-empty "
           "and of the same length (", mean.size(), " vs ", std.size(), ")");
  RG_CHECK(mean.size() == 1 || int64_t(mean.size()) == channels, "Normalize: ", mean.size(),
           " means for ", channels, " channels");
  for (int64_t c = 0; c < channels; ++c) {
    const size_t k = mean.size() == 1 ? 0 : size_t(c);
    const float m = mean[k], inv = 1.0f / std[k];
    float* p = sample + c * plane;
    for (int64_t i = 0; i < plane; ++i) p[i] = (p[i] - m) * inv;
  }
}

}  // namespace rg::data
