// Conv2d layer.
#include "layers/conv2d.h"

#include <cmath>

#include "engine/ops/conv2d.h"
#include "engine/ops/factory.h"
#include "kernels/error.h"
#include "layers/init.h"

namespace rg::nn {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, std::array<int64_t, 2> kernel,
               Generator& gen, Conv2dOptions options)
    : in_(in_channels), out_(out_channels), kernel_(kernel), options_(options) {
  RG_CHECK(in_channels > 0 && out_channels > 0 && kernel[0] > 0 && kernel[1] > 0,
           "Conv2d: channels and kernel sizes must be positive");
  Tensor w = empty({out_channels, in_channels, kernel[0], kernel[1]});
  init::kaiming_uniform_(w, std::sqrt(5.0), gen);
  weight = register_parameter("weight", w);
  if (options.bias) {
    Tensor b = empty({out_channels});
    init::uniform_(b, 1.0 / std::sqrt(double(init::fan_in(w))), gen);
    bias = register_parameter("bias", b);
  }
}

Tensor Conv2d::forward_impl(const Tensor& x) {
  return conv2d(x, weight, bias, options_.stride, options_.padding, options_.dilation);
}

std::string Conv2d::extra_repr() const {
  auto pair = [](std::array<int64_t, 2> a) {
    std::string s = "(";
    s += std::to_string(a[0]);
    s += ", ";
    s += std::to_string(a[1]);
    s += ")";
    return s;
  };
  return std::to_string(in_) + ", " + std::to_string(out_) + ", kernel_size=" + pair(kernel_) +
         ", stride=" + pair(options_.stride) + ", padding=" + pair(options_.padding) +
         (bias.defined() ? "" : ", bias=false");
}

}  // namespace rg::nn
