// Finite-difference gradient checks in f64: compares autograd gradients of a scalar function
// against central differences, input by input, element by element.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "engine/tensor.h"

namespace rg::testing {

struct GradcheckOptions {
  double eps = 1e-6;   // central-difference step
  double atol = 1e-5;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-4;
};

// f maps the inputs to a tensor of any shape; it is reduced to a scalar as sum(f(x) * w) with a
// fixed random weight w so every output element's gradient is exercised. Every input must be f64
// and require grad. Returns "" when all gradients match, else a description of the worst element.
std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                      const std::vector<Tensor>& inputs, GradcheckOptions opts = {});

// A f64 leaf tensor with values uniform in [low, high) that requires grad.
Tensor random_input(const Shape& shape, Generator& gen, double low = -1.0, double high = 1.0);

}  // namespace rg::testing
