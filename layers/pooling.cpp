// Pooling modules.
#include "layers/pooling.h"

#include "engine/ops/pool.h"

namespace rg::nn {

MaxPool2d::MaxPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                     std::array<int64_t, 2> padding)
    : kernel_(kernel), stride_(stride), padding_(padding) {}
Tensor MaxPool2d::forward_impl(const Tensor& x) {
  return max_pool2d(x, kernel_, stride_, padding_);
}

AvgPool2d::AvgPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                     std::array<int64_t, 2> padding)
    : kernel_(kernel), stride_(stride), padding_(padding) {}
Tensor AvgPool2d::forward_impl(const Tensor& x) {
  return avg_pool2d(x, kernel_, stride_, padding_);
}

Tensor AdaptiveAvgPool2d::forward_impl(const Tensor& x) { return adaptive_avg_pool2d(x, output_); }

}  // namespace rg::nn
