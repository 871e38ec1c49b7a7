// A user-defined autograd function through the public recipe that examples/custom_function.cpp
// teaches (engine/autograd/function.h): the forward computed under NoGradGuard, then
// autograd::record(out, name, inputs, backward) with SavedTensor captures. Checks that the
// hand-written backward is the one that runs, that it passes a finite-difference check, and that
// nothing is recorded when no gradient is wanted.
#include <gtest/gtest.h>

#include <vector>

#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/ops/activation.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/reduce.h"
#include "engine/ops/unary.h"
#include "support/gradcheck.h"

namespace rg {
namespace {

using autograd::SavedTensor;

// y = exp(x) * w, saving the intermediate exp(x) that both derivatives need:
// dy/dx = exp(x) * w, dy/dw = exp(x).
Tensor exp_times(const Tensor& x, const Tensor& w) {
  Tensor e, y;
  {
    NoGradGuard no_grad;
    e = exp(x);
    y = mul(e, w);
  }
  return autograd::record(y, "ExpTimesBackward", {x, w},
                          [se = SavedTensor(e), sw = SavedTensor(w)](const Tensor& g) {
                            return std::vector<Tensor>{mul(g, mul(se.get(), sw.get())),
                                                       mul(g, se.get())};
                          });
}

// relu forward, identity backward: a straight-through estimator, whose gradient differs from what
// the inner op's own backward would give.
Tensor straight_through_relu(const Tensor& x) {
  Tensor y;
  {
    NoGradGuard no_grad;
    y = relu(x);
  }
  return autograd::record(y, "StraightThroughBackward", {x},
                          [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

TEST(CustomFunction, HandWrittenBackwardMatchesFiniteDifferences) {
  Generator gen(3);
  const std::vector<Tensor> inputs = {testing::random_input({3, 5}, gen),
                                      testing::random_input({3, 5}, gen)};
  const std::string error = testing::gradcheck(
      [](const std::vector<Tensor>& in) { return exp_times(in[0], in[1]); }, inputs);
  EXPECT_EQ(error, "");
}

TEST(CustomFunction, ItsBackwardRunsInsteadOfTheInnerOps) {
  Tensor x = from_vector<double>({-2.0, -0.5, 0.5, 2.0}, {4}).set_requires_grad(true);
  Tensor y = straight_through_relu(x);
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{0.0, 0.0, 0.5, 2.0}));
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "StraightThroughBackward");
  sum(y).backward();
  // relu's own backward would give 0 for the negative inputs.
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1.0, 1.0, 1.0, 1.0}));
}

TEST(CustomFunction, NothingIsRecordedWithoutGradOrUnderNoGradGuard) {
  const Tensor x = from_vector<double>({1.0, 2.0}, {2});
  const Tensor w = from_vector<double>({3.0, 4.0}, {2});
  const Tensor plain = exp_times(x, w);  // no input requires grad
  EXPECT_FALSE(plain.requires_grad());
  EXPECT_EQ(plain.grad_fn(), nullptr);

  Tensor leaf = x.clone().set_requires_grad(true);
  NoGradGuard no_grad;
  const Tensor guarded = exp_times(leaf, w);
  EXPECT_FALSE(guarded.requires_grad());
  EXPECT_EQ(guarded.grad_fn(), nullptr);
}

}  // namespace
}  // namespace rg
