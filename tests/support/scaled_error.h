// Error of a result against a reference, relative to the reference's scale: the largest
// |a - ref| divided by the largest |ref| (for comparing convolution algorithms whose rounding
// grows with the output's magnitude, not with each element's).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace rg::test {

inline double scaled_error(const std::vector<double>& a, const std::vector<double>& ref) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(a[i] - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return err / scale;
}

}  // namespace rg::test
