// How far apart two models' parameters are, for tests that train the same model two ways (DDP
// vs one process, device vs CPU): max |a - b| / max(1, max |b|) over all parameters, computed
// in f64 whatever the parameters' dtype and device. Header-only so the emulated-device test
// binaries (linked against the _emu libraries) can use it too.
#pragma once

#include <algorithm>
#include <cmath>

#include "engine/tensor.h"
#include "kernels/error.h"
#include "layers/module.h"

namespace rg::testing {

inline double relative_parameter_difference(nn::Module& a, nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  RG_CHECK(pa.size() == pb.size(), "models differ in parameter count: ", pa.size(), " vs ",
           pb.size());
  double diff = 0, scale = 1;
  for (size_t i = 0; i < pa.size(); ++i) {
    const auto va = pa[i].to(DType::f64).to_vector<double>();
    const auto vb = pb[i].to(DType::f64).to_vector<double>();
    RG_CHECK(va.size() == vb.size(), "parameter ", i, " differs in size");
    for (size_t k = 0; k < va.size(); ++k) {
      diff = std::max(diff, std::fabs(va[k] - vb[k]));
      scale = std::max(scale, std::fabs(vb[k]));
    }
  }
  return diff / scale;
}

}  // namespace rg::testing
