// Central-difference gradient checker used by every op's gradcheck test.
#include "support/gradcheck.h"

#include <cmath>
#include <sstream>

#include "engine/autograd/grad_mode.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/reduce.h"

namespace rg::testing {

Tensor random_input(const Shape& shape, Generator& gen, double low, double high) {
  Tensor t = empty(shape, DType::f64);
  uniform_(t, low, high, gen);
  t.set_requires_grad(true);
  return t;
}

std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                      const std::vector<Tensor>& inputs, GradcheckOptions opts) {
  for (const Tensor& x : inputs) {
    if (x.dtype() != DType::f64 || !x.requires_grad()) {
      return "gradcheck: every input must be a f64 tensor that requires grad";
    }
    x.zero_grad();
  }
  Tensor probe;
  {
    NoGradGuard ng;
    probe = f(inputs);
  }
  Generator wgen(1234);
  Tensor w = rand(probe.shape(), wgen, DType::f64);
  {
    NoGradGuard ng;
    w = add(w, 0.5);  // weights in [0.5, 1.5): no output is ignored
  }
  auto scalar = [&](const std::vector<Tensor>& xs) { return sum(mul(f(xs), w)); };

  Tensor loss = scalar(inputs);
  loss.backward();

  std::ostringstream report;
  double worst = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    Tensor analytic = x.grad();
    std::vector<double> a = analytic.defined() ? analytic.to_vector<double>()
                                               : std::vector<double>(size_t(x.numel()), 0.0);
    double* p = x.data<double>();
    for (int64_t j = 0; j < x.numel(); ++j) {
      const double orig = p[j];
      double plus, minus;
      {
        NoGradGuard ng;
        p[j] = orig + opts.eps;
        plus = scalar(inputs).item();
        p[j] = orig - opts.eps;
        minus = scalar(inputs).item();
        p[j] = orig;
      }
      const double numeric = (plus - minus) / (2 * opts.eps);
      const double err = std::fabs(a[size_t(j)] - numeric);
      const double tol = opts.atol + opts.rtol * std::fabs(numeric);
      if (err > tol && err - tol > worst) {
        worst = err - tol;
        report.str("");
        report << "input " << i << " element " << j << ": analytic " << a[size_t(j)]
               << " vs numeric " << numeric << " (|diff| " << err << " > tol " << tol << ")";
      }
    }
  }
  return report.str();
}

}  // namespace rg::testing
