// LayerNorm module: the layer_norm op over the last dimension with its own weight and bias.
#include "layers/layer_norm.h"

#include <sstream>

#include "engine/ops/factory.h"
#include "engine/ops/layer_norm.h"
#include "kernels/error.h"

namespace rg::nn {

LayerNorm::LayerNorm(int64_t normalized_size, double eps, bool elementwise_affine)
    : size_(normalized_size), eps_(eps), affine_(elementwise_affine) {
  RG_CHECK(normalized_size > 0, "LayerNorm: normalized size must be positive, got ",
           normalized_size);
  if (affine_) {
    weight = register_parameter("weight", ones({normalized_size}));
    bias = register_parameter("bias", zeros({normalized_size}));
  }
}

Tensor LayerNorm::forward_impl(const Tensor& x) {
  RG_CHECK(x.dim() >= 1 && x.size(x.dim() - 1) == size_, "LayerNorm(", size_,
           "): expected an input [..., ", size_, "], got ", shape_str(x.shape()));
  return layer_norm(x, weight, bias, eps_);
}

std::string LayerNorm::extra_repr() const {
  std::ostringstream s;
  s << "(" << size_ << ",), eps=" << eps_
    << ", elementwise_affine=" << (affine_ ? "True" : "False");
  return s.str();
}

}  // namespace rg::nn
