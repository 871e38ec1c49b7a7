// Elementwise math: neg, exp, log, sqrt, pow with a scalar exponent.
#pragma once

#include "engine/tensor.h"

namespace rg {

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
inline Tensor operator-(const Tensor& x) { return neg(x); }

}  // namespace rg
