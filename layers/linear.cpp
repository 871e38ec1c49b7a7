// Linear layer.
#include "layers/linear.h"

#include <cmath>

#include "engine/ops/factory.h"
#include "engine/ops/matmul.h"
#include "kernels/error.h"
#include "layers/init.h"

namespace rg::nn {

Linear::Linear(int64_t in_features, int64_t out_features, Generator& gen, bool with_bias)
    : in_(in_features), out_(out_features) {
  RG_CHECK(in_features > 0 && out_features > 0, "Linear: features must be positive, got (",
           in_features, ", ", out_features, ")");
  Tensor w = empty({out_features, in_features});
  init::kaiming_uniform_(w, std::sqrt(5.0), gen);
  weight = register_parameter("weight", w);
  if (with_bias) {
    Tensor b = empty({out_features});
    init::uniform_(b, 1.0 / std::sqrt(double(in_features)), gen);
    bias = register_parameter("bias", b);
  }
}

Tensor Linear::forward_impl(const Tensor& x) { return linear(x, weight, bias); }

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(in_) + ", out_features=" + std::to_string(out_) +
         ", bias=" + (bias.defined() ? "true" : "false");
}

}  // namespace rg::nn
