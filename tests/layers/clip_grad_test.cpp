// nn::utils::clip_grad_norm_ and clip_grad_value_ against torch.nn.utils' rules, worked by hand:
// the norm over all gradients together, the clamped coefficient, inf and p norms, NaN handling,
// skipped parameters, the bad values, and clipping between GradScaler's unscale_ and step.
#include "layers/clip_grad.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "layers/amp/grad_scaler.h"
#include "layers/linear.h"
#include "layers/optim/optimizer.h"
#include "support/errors.h"

namespace rg::nn::utils {
namespace {

using testing::expect_error;

Tensor param_with_grad(std::vector<float> grad) {
  const auto n = static_cast<int64_t>(grad.size());
  Tensor p = zeros({n});
  p.set_requires_grad(true);
  p.set_grad(from_vector<float>(grad, {n}));
  return p;
}

void expect_grad(const Tensor& p, const std::vector<double>& expected, double tol = 1e-6) {
  const std::vector<double> got = p.grad().to_vector<double>();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], tol) << "element " << i;
}

TEST(ClipGradNorm, ScalesEveryGradientByTheClampedCoefficientOfTheTotalNorm) {
  // Gradients (3, 0) and (4): total 2-norm 5 over both, not per parameter.
  Tensor a = param_with_grad({3, 0}), b = param_with_grad({4});
  const Tensor total = clip_grad_norm_({a, b}, 1.0);
  EXPECT_EQ(total.dim(), 0);
  EXPECT_NEAR(total.item(), 5.0, 1e-6);
  const double coef = 1.0 / (5.0 + 1e-6);
  expect_grad(a, {3 * coef, 0});
  expect_grad(b, {4 * coef});
  // Now of norm ~1: a max_norm above it leaves them as they are (coefficient clamped to 1).
  const std::vector<double> before = a.grad().to_vector<double>();
  EXPECT_NEAR(clip_grad_norm_({a, b}, 10.0).item(), 5.0 * coef, 1e-6);
  EXPECT_EQ(a.grad().to_vector<double>(), before);
}

TEST(ClipGradNorm, InfinityAndOtherOrders) {
  Tensor a = param_with_grad({-3, 1}), b = param_with_grad({2});
  EXPECT_NEAR(clip_grad_norm_({a, b}, 1.5, INFINITY).item(), 3.0, 1e-6);  // max |g|
  const double c = 1.5 / (3.0 + 1e-6);
  expect_grad(a, {-3 * c, 1 * c});
  expect_grad(b, {2 * c});

  Tensor d = param_with_grad({-3, 1}), e = param_with_grad({2});
  EXPECT_NEAR(clip_grad_norm_({d, e}, 100.0, 1.0).item(), 6.0, 1e-6);
  EXPECT_NEAR(clip_grad_norm_({d, e}, 100.0, 3.0).item(), std::cbrt(27.0 + 1 + 8), 1e-5);
  expect_grad(d, {-3, 1});  // never clipped: the norms are below 100
}

TEST(ClipGradNorm, SkipsParametersWithoutGradientsAndReturnsZeroWithoutAny) {
  Tensor none = zeros({3});
  none.set_requires_grad(true);
  Tensor a = param_with_grad({0, 4});
  EXPECT_NEAR(clip_grad_norm_({none, a}, 2.0).item(), 4.0, 1e-6);
  EXPECT_FALSE(none.grad().defined());
  expect_grad(a, {0, 2.0 * 4 / (4 + 1e-6)});
  EXPECT_EQ(clip_grad_norm_({none}, 1.0).item(), 0.0);
  EXPECT_EQ(clip_grad_norm_({}, 1.0).item(), 0.0);
}

TEST(ClipGradNorm, GradientsOfTwoDtypesGiveTheNormOfTheGroupNorms) {
  Tensor a = param_with_grad({3});
  Tensor b = zeros({1}, DType::f64);
  b.set_requires_grad(true);
  b.set_grad(from_vector<double>({4}, {1}));
  const Tensor total = clip_grad_norm_({a, b}, 1.0);
  EXPECT_EQ(total.dtype(), DType::f32);  // the first group's
  EXPECT_NEAR(total.item(), 5.0, 1e-6);
  expect_grad(b, {4.0 / 5.0}, 1e-6);
}

TEST(ClipGradNorm, NonFiniteNormIsAnErrorOnlyWhenAsked) {
  Tensor a = param_with_grad({NAN, 1});
  expect_error([&] { clip_grad_norm_({a}, 1.0, 2.0, true); },
               "clip_grad_norm_: the total norm of order 2 of the gradients is nan");
  // The refused call changed nothing.
  EXPECT_TRUE(std::isnan(a.grad().to_vector<double>()[0]));
  EXPECT_EQ(a.grad().to_vector<double>()[1], 1.0);
}

TEST(ClipGradNorm, NanNormPoisonsTheGradientsAsInPyTorch) {
  Tensor a = param_with_grad({NAN, 1}), b = param_with_grad({2});
  EXPECT_TRUE(std::isnan(clip_grad_norm_({a, b}, 1.0).item()));
  EXPECT_TRUE(std::isnan(b.grad().item()));
  Tensor c = param_with_grad({std::numeric_limits<float>::infinity(), 1});
  expect_error([&] { clip_grad_norm_({c}, 1.0, INFINITY, true); }, "is inf");
}

TEST(ClipGradNorm, BadValuesAreClearErrors) {
  Tensor a = param_with_grad({1});
  expect_error([&] { clip_grad_norm_({a}, -1.0); },
               "clip_grad_norm_: max_norm must be >= 0, got -1");
  expect_error([&] { clip_grad_norm_({a}, NAN); }, "max_norm must be >= 0, got nan");
  expect_error([&] { clip_grad_norm_({a}, 1.0, 0.0); }, "norm_type must be > 0 (or inf), got 0");
  expect_error([&] { clip_grad_norm_({a}, 1.0, -INFINITY); }, "norm_type must be > 0");
  expect_error([&] { clip_grad_norm_({Tensor()}, 1.0); }, "a parameter is an undefined tensor");
  expect_grad(a, {1});
}

TEST(ClipGradValue, ClampsEachElementAndKeepsNan) {
  Tensor a = param_with_grad({-3, 0.5f, 2, NAN}), none = zeros({2});
  none.set_requires_grad(true);
  clip_grad_value_({a, none}, 1.0);
  const std::vector<double> g = a.grad().to_vector<double>();
  EXPECT_EQ(g[0], -1.0);
  EXPECT_EQ(g[1], 0.5);
  EXPECT_EQ(g[2], 1.0);
  EXPECT_TRUE(std::isnan(g[3]));
  EXPECT_FALSE(none.grad().defined());
  clip_grad_value_({a}, 0.0);
  EXPECT_EQ(a.grad().to_vector<double>()[0], 0.0);
  expect_error([&] { clip_grad_value_({a}, -0.1); },
               "clip_grad_value_: clip_value must be >= 0, got -0.1");
  expect_error([&] { clip_grad_value_({a}, NAN); }, "clip_value must be >= 0, got nan");
}

// scale -> backward -> unscale_ -> clip -> step gives the same parameters as an unscaled
// backward, clip and step: the clip sees the true gradients, and step does not unscale again.
TEST(ClipGradNorm, BetweenGradScalerUnscaleAndStepClipsTheTrueGradients) {
  Generator g1(3), g2(3), data(4);
  nn::Linear plain(6, 3, g1), scaled(6, 3, g2);
  const Tensor x = randn({5, 6}, data) * 10.0;
  const Tensor y = from_vector<int64_t>({0, 1, 2, 1, 0}, {5});
  optim::Sgd plain_opt(plain.parameters(), {.lr = 0.5});
  cross_entropy(plain.forward(x), y).backward();
  const double plain_norm = clip_grad_norm_(plain.parameters(), 0.25).item();
  plain_opt.step();

  amp::GradScaler scaler({.init_scale = 1024.0});
  optim::Sgd opt(scaled.parameters(), {.lr = 0.5});
  scaler.scale(cross_entropy(scaled.forward(x), y)).backward();
  scaler.unscale_(opt);
  const double norm = clip_grad_norm_(scaled.parameters(), 0.25).item();
  EXPECT_GT(norm, 0.25);  // the clip did something
  EXPECT_NEAR(norm, plain_norm, 1e-5 * plain_norm);
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  for (size_t i = 0; i < plain.parameters().size(); ++i) {
    const std::vector<double> a = plain.parameters()[i].to_vector<double>();
    const std::vector<double> b = scaled.parameters()[i].to_vector<double>();
    for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j], b[j], 1e-5) << i << "," << j;
  }
}

}  // namespace
}  // namespace rg::nn::utils
