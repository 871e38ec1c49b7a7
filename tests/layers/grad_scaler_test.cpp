// amp::GradScaler against torch.amp.GradScaler's rules: scaled backward + unscale gives the plain
// gradients, inf/NaN skips the step and backs the scale off, growth after growth_interval good
// steps (never to inf), the per-optimizer stage errors, and the disabled scaler.
#include "layers/amp/grad_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/ops/reduce.h"
#include "layers/linear.h"
#include "layers/optim/optimizer.h"
#include "support/errors.h"

namespace rg::amp {
namespace {

// A parameter with the given values and gradient.
Tensor param_with_grad(std::vector<float> value, std::vector<float> grad) {
  const int64_t n = static_cast<int64_t>(value.size());
  Tensor p = from_vector<float>(value, {n});
  p.set_requires_grad(true);
  p.set_grad(from_vector<float>(grad, {n}));
  return p;
}

TEST(GradScaler, ScaledBackwardThenUnscaleGivesThePlainGradients) {
  Generator g1(1), g2(1), data(2);
  nn::Linear plain(6, 3, g1), scaled(6, 3, g2);
  const Tensor x = randn({5, 6}, data);
  const Tensor y = from_vector<int64_t>({0, 1, 2, 1, 0}, {5});
  cross_entropy(plain.forward(x), y).backward();

  GradScaler scaler({.init_scale = 1024.0});
  optim::Sgd opt(scaled.parameters(), {.lr = 0.1});
  const Tensor loss = cross_entropy(scaled.forward(x), y);
  const Tensor s = scaler.scale(loss);
  EXPECT_FLOAT_EQ(s.item<float>(), loss.item<float>() * 1024.f);
  s.backward();
  // Before unscale_ the gradients are 1024 times the plain ones.
  EXPECT_FLOAT_EQ(scaled.parameters()[0].grad().to_vector<float>()[0],
                  plain.parameters()[0].grad().to_vector<float>()[0] * 1024.f);
  scaler.unscale_(opt);
  const auto pp = plain.parameters(), sp = scaled.parameters();
  for (size_t i = 0; i < pp.size(); ++i) {
    // A power-of-two scale is exact both ways.
    EXPECT_EQ(sp[i].grad().to_vector<float>(), pp[i].grad().to_vector<float>()) << i;
  }
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.growth_tracker(), 1);
  EXPECT_EQ(scaler.get_scale(), 1024.0);
}

TEST(GradScaler, TrainingWithTheScalerMatchesTrainingWithout) {
  Generator g1(4), g2(4), data(5);
  nn::Linear a(8, 4, g1), b(8, 4, g2);
  optim::Sgd opt_a(a.parameters(), {.lr = 0.05, .momentum = 0.9});
  optim::Sgd opt_b(b.parameters(), {.lr = 0.05, .momentum = 0.9});
  GradScaler scaler({.growth_interval = 2});  // the scale grows during the run
  for (int step = 0; step < 6; ++step) {
    const Tensor x = randn({16, 8}, data);
    const Tensor y = from_vector<int64_t>(std::vector<int64_t>(16, step % 4), {16});
    opt_a.zero_grad();
    cross_entropy(a.forward(x), y).backward();
    opt_a.step();
    opt_b.zero_grad();
    scaler.scale(cross_entropy(b.forward(x), y)).backward();
    EXPECT_TRUE(scaler.step(opt_b));
    scaler.update();
  }
  EXPECT_EQ(scaler.get_scale(), 65536.0 * 8);  // grew after steps 2, 4 and 6
  const auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pb[i].to_vector<float>(), pa[i].to_vector<float>()) << i;
  }
}

TEST(GradScaler, InfOrNanSkipsTheStepAndBacksOff) {
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                    -std::numeric_limits<float>::infinity()}) {
    Tensor good = param_with_grad({1.f, 2.f}, {4.f, 8.f});
    Tensor hit = param_with_grad({3.f, 4.f, 5.f}, {1.f, bad, 1.f});
    optim::Sgd opt({good, hit}, {.lr = 1.0});
    GradScaler scaler({.init_scale = 4.0, .growth_interval = 1});
    EXPECT_FALSE(scaler.step(opt)) << bad;
    EXPECT_EQ(good.to_vector<float>(), (std::vector<float>{1.f, 2.f})) << "the step was skipped";
    EXPECT_EQ(hit.to_vector<float>(), (std::vector<float>{3.f, 4.f, 5.f}));
    EXPECT_EQ(good.grad().to_vector<float>(), (std::vector<float>{1.f, 2.f})) << "but unscaled";
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 2.0);
    EXPECT_EQ(scaler.growth_tracker(), 0);
  }
}

TEST(GradScaler, GrowsAfterGrowthIntervalGoodStepsAndABadStepResetsTheCount) {
  Tensor p = param_with_grad({0.f}, {0.f});
  optim::Sgd opt({p}, {.lr = 1.0});
  GradScaler scaler(
      {.init_scale = 8.0, .growth_factor = 4.0, .backoff_factor = 0.25, .growth_interval = 3});
  const auto iteration = [&](float grad) {
    p.set_grad(full({1}, grad));
    scaler.step(opt);
    scaler.update();
  };
  iteration(1.f);
  iteration(1.f);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  iteration(std::numeric_limits<float>::infinity());
  EXPECT_EQ(scaler.get_scale(), 2.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  iteration(1.f);
  iteration(1.f);
  EXPECT_EQ(scaler.get_scale(), 2.0);
  iteration(1.f);
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, GrowthThatWouldOverflowF32KeepsTheScale) {
  Tensor p = param_with_grad({0.f}, {0.f});
  optim::Sgd opt({p}, {.lr = 1.0});
  const double big = 0x1p127;
  GradScaler scaler({.init_scale = big, .growth_interval = 1});
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), big);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, StageOrderIsEnforcedPerOptimizer) {
  Tensor p = param_with_grad({0.f}, {1.f}), q = param_with_grad({0.f}, {1.f});
  optim::Sgd a({p}, {.lr = 1.0}), b({q}, {.lr = 1.0});
  GradScaler scaler;
  testing::expect_error([&] { scaler.update(); }, "no inf/NaN checks were recorded");
  scaler.unscale_(a);
  testing::expect_error([&] { scaler.unscale_(a); }, "already called on this optimizer");
  EXPECT_TRUE(scaler.step(a));  // after unscale_: steps without unscaling twice
  EXPECT_FLOAT_EQ(p.item<float>(), -1.f / 65536.f);
  testing::expect_error([&] { scaler.step(a); }, "already called on this optimizer");
  testing::expect_error([&] { scaler.unscale_(a); }, "called after step()");
  scaler.step(b);  // another optimizer has its own stage
  scaler.update();
  scaler.unscale_(a);  // the next iteration
}

TEST(GradScaler, OneOptimizersInfBacksOffButOnlySkipsThatOptimizer) {
  Tensor p = param_with_grad({0.f}, {1.f});
  Tensor q = param_with_grad({0.f}, {std::numeric_limits<float>::infinity()});
  optim::Sgd a({p}, {.lr = 1.0}), b({q}, {.lr = 1.0});
  GradScaler scaler({.init_scale = 2.0});
  EXPECT_TRUE(scaler.step(a));
  EXPECT_FALSE(scaler.step(b));
  EXPECT_EQ(p.item<float>(), -0.5f);
  EXPECT_EQ(q.item<float>(), 0.f);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

TEST(GradScaler, ParametersWithoutGradientsAreSkipped) {
  Tensor p = param_with_grad({1.f}, {2.f});
  Tensor none = from_vector<float>({5.f}, {1});
  none.set_requires_grad(true);
  optim::Sgd opt({p, none}, {.lr = 1.0});
  GradScaler scaler({.init_scale = 2.0});
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_EQ(p.item<float>(), 0.f);
  EXPECT_EQ(none.item<float>(), 5.f);
}

TEST(GradScaler, DisabledIsThePlainLoop) {
  Tensor p = param_with_grad({1.f}, {std::numeric_limits<float>::infinity()});
  optim::Sgd opt({p}, {.lr = 1.0});
  GradScaler scaler({.enabled = false});
  const Tensor loss = full({}, 3.0);
  EXPECT_EQ(scaler.scale(loss).item(), 3.0);
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_TRUE(scaler.step(opt));  // no inf check: the optimizer steps
  EXPECT_TRUE(std::isinf(p.item<float>()));
  scaler.update();  // nothing recorded, no error
}

TEST(GradScaler, HalfLossesAreScaledInF32) {
  GradScaler scaler;  // 65536 * 2 overflows f16 (max 65504)
  const Tensor s = scaler.scale(full({}, 2.0, DType::f16));
  EXPECT_EQ(s.dtype(), DType::f32);
  EXPECT_EQ(s.item(), 131072.0);
}

TEST(GradScaler, UpdateWithANewScaleAndStateRoundTrip) {
  Tensor p = param_with_grad({0.f}, {1.f});
  optim::Sgd opt({p}, {.lr = 1.0});
  GradScaler scaler({.growth_interval = 5});
  scaler.step(opt);
  scaler.update(512.0);
  EXPECT_EQ(scaler.get_scale(), 512.0);
  scaler.step(opt);
  scaler.update();
  const GradScaler::State saved = scaler.state();
  EXPECT_EQ(saved.scale, 512.0);
  EXPECT_EQ(saved.growth_tracker, 1);
  GradScaler restored({.growth_interval = 5});
  restored.load_state(saved);
  EXPECT_EQ(restored.get_scale(), 512.0);
  EXPECT_EQ(restored.growth_tracker(), 1);
}

TEST(GradScaler, BadOptionsAndStatesAreClearErrors) {
  testing::expect_error([] { GradScaler s({.init_scale = 0.0}); }, "init_scale must be positive");
  testing::expect_error([] { GradScaler s({.init_scale = 1e39}); }, "within f32");
  testing::expect_error([] { GradScaler s({.growth_factor = 1.0}); }, "growth_factor must be > 1");
  testing::expect_error([] { GradScaler s({.backoff_factor = 1.0}); }, "backoff_factor must be in");
  testing::expect_error([] { GradScaler s({.growth_interval = 0}); },
                        "growth_interval must be > 0");
  GradScaler scaler({.growth_interval = 3});
  testing::expect_error([&] { scaler.update(-1.0); }, "the new scale must be positive");
  testing::expect_error([&] { scaler.load_state({.scale = 2.0, .growth_tracker = 3}); },
                        "outside [0, growth_interval = 3)");
  testing::expect_error([&] { scaler.scale(from_vector<int64_t>({1}, {1})); },
                        "expected a floating-point loss");
  // An f16 gradient is refused before any gradient is unscaled, so nothing changes.
  Tensor f = param_with_grad({1.f}, {2.f});
  Tensor h = full({1}, 1.0, DType::f16);
  h.set_requires_grad(true);
  h.set_grad(full({1}, 1.0, DType::f16));
  optim::Sgd opt({f, h}, {.lr = 1.0});
  testing::expect_error([&] { scaler.unscale_(opt); }, "parameter 1 is f16; keep f32 master");
  EXPECT_EQ(f.grad().item<float>(), 2.f) << "the f32 gradient was not unscaled";
}

}  // namespace
}  // namespace rg::amp
