// A custom autograd function: an operation whose backward you write yourself, as a subclass of
// torch.autograd.Function does in PyTorch, then checked against finite differences.
//
// The function is y = w * softplus(x) elementwise, softplus(x) = log(1 + exp(x)), written in the
// numerically stable form max(x, 0) + log(1 + exp(-|x|)) (exp(x) alone overflows for x > 88 in f32).
// Its derivatives:  dy/dx = w * sigmoid(x),  dy/dw = softplus(x).
//
// How a function is recorded (engine/autograd/function.h, the same helper ringgrad's own ops use):
//   1. compute the output without recording a graph (NoGradGuard): the inner ops' own backward
//      is not wanted, ours replaces it;
//   2. autograd::record(output, "Name", {inputs...}, backward) attaches a node whose backward is
//      a lambda: given dL/dy it returns dL/d(input) for each input, in order (an undefined
//      Tensor for an input that gets no gradient). It captures what it needs as SavedTensor,
//      which refuses to hand back a tensor that was modified in place after the forward.
// When no input requires grad (or inside NoGradGuard) record does nothing: no graph is built.
#include <ringgrad/engine/autograd/function.h>
#include <ringgrad/engine/autograd/grad_mode.h>
#include <ringgrad/engine/error.h>
#include <ringgrad/engine/generator.h>
#include <ringgrad/engine/ops/activation.h>
#include <ringgrad/engine/ops/binary.h>
#include <ringgrad/engine/ops/factory.h>
#include <ringgrad/engine/ops/reduce.h>
#include <ringgrad/engine/ops/unary.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

using namespace rg;
using autograd::SavedTensor;

// softplus(x) = max(x, 0) + log(1 + exp(-|x|)), from the library's differentiable ops.
Tensor stable_softplus(const Tensor& x) {
  const Tensor abs_x = add(relu(x), relu(neg(x)));
  return add(relu(x), log(add(exp(neg(abs_x)), 1.0)));
}

// y = w * softplus(x), with a hand-written backward.
Tensor weighted_softplus(const Tensor& x, const Tensor& w) {
  Tensor y;
  {
    NoGradGuard no_grad;  // step 1: no graph for the forward's inner ops
    y = mul(w, stable_softplus(x));
  }
  // Step 2. Backward runs with grad mode off, so the ops inside record nothing either.
  return autograd::record(y, "WeightedSoftplusBackward", {x, w},
                          [sx = SavedTensor(x), sw = SavedTensor(w)](const Tensor& grad_y) {
                            const Tensor x = sx.get(), w = sw.get();
                            Tensor grad_x = mul(grad_y, mul(w, sigmoid(x)));
                            Tensor grad_w = mul(grad_y, stable_softplus(x));
                            return std::vector<Tensor>{grad_x, grad_w};
                          });
}

// Compares d(loss)/d(input) from backward with central differences (f(v + h) - f(v - h)) / 2h,
// element by element, for each input. f64 throughout, so h = 1e-6 leaves an error near 1e-9.
// Returns the largest error relative to max(1, |gradient|).
double max_gradient_error(const std::function<Tensor(const std::vector<Tensor>&)>& loss_of,
                          std::vector<Tensor> inputs) {
  for (Tensor& t : inputs) t = t.detach().clone().set_requires_grad(true);  // fresh leaves
  loss_of(inputs).backward();

  double worst = 0;
  const double h = 1e-6;
  NoGradGuard no_grad;  // the numerical side needs no graph
  for (size_t k = 0; k < inputs.size(); ++k) {
    const std::vector<double> analytic = inputs[k].grad().to_vector<double>();
    for (int64_t i = 0; i < inputs[k].numel(); ++i) {
      // Perturb element i of a copy of input k; the other inputs stay as they are.
      std::vector<Tensor> shifted = inputs;
      shifted[k] = inputs[k].detach().clone();
      double* v = shifted[k].data<double>();
      const double original = v[i];
      v[i] = original + h;
      const double up = loss_of(shifted).item();
      v[i] = original - h;
      const double down = loss_of(shifted).item();
      const double numeric = (up - down) / (2 * h);
      const double g = analytic[size_t(i)];
      worst = std::max(worst, std::abs(g - numeric) / std::max(1.0, std::abs(g)));
    }
  }
  return worst;
}

int run() {
  Generator gen(0);
  // Inputs in f64 (for the finite differences); x spans large |x| too, where the naive formula
  // would lose precision.
  const Tensor x = mul(randn({3, 4}, gen, DType::f64), 5.0);
  const Tensor w = randn({3, 4}, gen, DType::f64);
  const Tensor r = randn({3, 4}, gen, DType::f64);  // loss = sum(y * r): every dy/d. counts
  const auto loss = [&](const std::vector<Tensor>& in) {
    return sum(mul(weighted_softplus(in[0], in[1]), r));
  };

  const double error = max_gradient_error(loss, {x, w});
  const double tolerance = 1e-6;
  std::printf("custom_function: WeightedSoftplusBackward vs finite differences: max relative error "
              "%.3g (tolerance %g)\n", error, tolerance);

  // The check has teeth: a backward that forgets the factor w in dy/dx fails it.
  const auto wrong = [&](const std::vector<Tensor>& in) {
    Tensor y;
    {
      NoGradGuard no_grad;
      y = mul(in[1], stable_softplus(in[0]));
    }
    y = autograd::record(y, "WrongBackward", {in[0], in[1]},
                         [sx = SavedTensor(in[0])](const Tensor& g) {
                           const Tensor x = sx.get();
                           return std::vector<Tensor>{mul(g, sigmoid(x)), mul(g, stable_softplus(x))};
                         });
    return sum(mul(y, r));
  };
  const double wrong_error = max_gradient_error(wrong, {x, w});
  std::printf("custom_function: a wrong backward (dy/dx without w) is caught: error %.3g\n",
              wrong_error);

  const bool ok = error < tolerance && wrong_error > 1e-2;
  std::printf("custom_function: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

int main() {
  try {
    return run();
  } catch (const rg::Error& e) {
    std::fprintf(stderr, "custom_function: %s\n", e.what());
    return 1;
  }
}
