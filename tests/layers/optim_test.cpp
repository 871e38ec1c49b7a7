// Optimizers against hand-computed steps and LR schedules against PyTorch's closed forms.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/ops/factory.h"
#include "kernels/error.h"
#include "layers/optim/lr_schedule.h"
#include "layers/optim/optimizer.h"

namespace rg::optim {
namespace {

// A one-element parameter with value p and gradient g.
Tensor param(double p, double g) {
  Tensor t = full({1}, p, DType::f64);
  t.set_requires_grad(true);
  t.set_grad(full({1}, g, DType::f64));
  return t;
}

TEST(Sgd, PlainStep) {
  Tensor p = param(1.0, 0.5);
  Sgd opt({p}, {.lr = 0.1});
  opt.step();
  EXPECT_DOUBLE_EQ(p.item(), 0.95);
}

TEST(Sgd, MomentumAndWeightDecayTwoSteps) {
  // step 1: d = 0.5 + 0.01*1 = 0.51, buf = 0.51, p = 1 - 0.051 = 0.949
  // step 2: d = 0.5 + 0.00949 = 0.50949, buf = 0.9*0.51 + 0.50949 = 0.96849, p = 0.852151
  Tensor p = param(1.0, 0.5);
  Sgd opt({p}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  opt.step();
  EXPECT_NEAR(p.item(), 0.949, 1e-12);
  opt.step();
  EXPECT_NEAR(p.item(), 0.852151, 1e-12);
  EXPECT_NEAR(opt.momentum_buffer(0).item(), 0.96849, 1e-12);
}

TEST(Sgd, DampeningAppliesFromSecondStep) {
  // step 1: buf = 0.5 (no dampening on the first step), p = 0.95
  // step 2: buf = 0.9*0.5 + 0.5*0.5 = 0.7, p = 0.95 - 0.07 = 0.88
  Tensor p = param(1.0, 0.5);
  Sgd opt({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
  opt.step();
  opt.step();
  EXPECT_NEAR(p.item(), 0.88, 1e-12);
}

TEST(Sgd, Nesterov) {
  // step 1: buf = 0.5, d = 0.5 + 0.9*0.5 = 0.95, p = 1 - 0.095 = 0.905
  // step 2: buf = 0.45 + 0.5 = 0.95, d = 0.5 + 0.855 = 1.355, p = 0.905 - 0.1355 = 0.7695
  Tensor p = param(1.0, 0.5);
  Sgd opt({p}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  opt.step();
  EXPECT_NEAR(p.item(), 0.905, 1e-12);
  opt.step();
  EXPECT_NEAR(p.item(), 0.7695, 1e-12);
}

TEST(Sgd, SkipsParametersWithoutGradAndValidates) {
  Tensor a = param(1.0, 0.5);
  Tensor b = full({1}, 2.0, DType::f64);
  b.set_requires_grad(true);
  Sgd opt({a, b}, {.lr = 1.0});
  opt.step();
  EXPECT_EQ(b.item(), 2.0);
  EXPECT_EQ(a.item(), 0.5);
  EXPECT_THROW(Sgd({a}, {.lr = 0.1, .nesterov = true}), Error);
  EXPECT_THROW(Sgd({a}, {.lr = -1}), Error);
  EXPECT_THROW(Sgd({full({1}, 1.0)}, {.lr = 0.1}), Error);  // does not require grad
}

TEST(Adam, TwoStepsWithConstantGradient) {
  // With a constant gradient the bias-corrected ratio m_hat/sqrt(v_hat) is exactly 1:
  // step 1: m = 0.05, v = 0.00025, m_hat = 0.5, v_hat = 0.25 -> p = 1 - 0.1 * 0.5/0.5 = 0.9
  // step 2: m = 0.095, v = 0.00049975, m_hat = 0.5, v_hat = 0.25 -> p = 0.8
  Tensor p = param(1.0, 0.5);
  Adam opt({p}, {.lr = 0.1});
  opt.step();
  EXPECT_NEAR(p.item(), 0.9, 1e-7);
  opt.step();
  EXPECT_NEAR(p.item(), 0.8, 1e-7);
}

TEST(Adam, L2WeightDecayVersusDecoupled) {
  // Adam(wd=0.5): g = 0.5 + 0.5*1 = 1.0, first step moves by lr: p = 0.9.
  // AdamW(wd=0.5): p = 1 * (1 - 0.1*0.5) = 0.95, then -0.1: 0.85.
  Tensor a = param(1.0, 0.5), b = param(1.0, 0.5);
  Adam adam({a}, {.lr = 0.1, .weight_decay = 0.5});
  auto adamw = make_adamw({b}, {.lr = 0.1, .weight_decay = 0.5});
  adam.step();
  adamw->step();
  EXPECT_NEAR(a.item(), 0.9, 1e-7);
  EXPECT_NEAR(b.item(), 0.85, 1e-7);
  EXPECT_EQ(adamw->name(), "adamw");
}

TEST(Adam, ThirdStepAgainstFormula) {
  // Varying gradients 0.5, -0.2, 0.1 from p = 1, lr 0.01; expected from the update formula
  // computed independently here in double precision.
  Tensor p = param(1.0, 0.5);
  Adam opt({p}, {.lr = 0.01});
  double m = 0, v = 0, x = 1.0;
  const double grads[] = {0.5, -0.2, 0.1};
  for (int t = 1; t <= 3; ++t) {
    p.set_grad(full({1}, grads[t - 1], DType::f64));
    opt.step();
    const double g = grads[t - 1];
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    const double mh = m / (1 - std::pow(0.9, t)), vh = v / (1 - std::pow(0.999, t));
    x -= 0.01 * mh / (std::sqrt(vh) + 1e-8);
    EXPECT_NEAR(p.item(), x, 1e-9) << "step " << t;
  }
}

TEST(LrSchedule, StepLr) {
  StepLr s(0.1, 30, 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(29), 0.1);
  EXPECT_NEAR(s.lr_at(30), 0.01, 1e-15);
  EXPECT_NEAR(s.lr_at(65), 0.001, 1e-15);
}

TEST(LrSchedule, MultiStepLr) {
  MultiStepLr s(0.1, {10, 20}, 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.05);
  EXPECT_DOUBLE_EQ(s.lr_at(25), 0.025);
}

TEST(LrSchedule, CosineClosedForm) {
  CosineLr s(1.0, 10, 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1.0);
  EXPECT_NEAR(s.lr_at(5), 0.55, 1e-12);  // 0.1 + 0.9 * (1 + cos(pi/2)) / 2
  EXPECT_NEAR(s.lr_at(10), 0.1, 1e-12);
  EXPECT_NEAR(s.lr_at(3), 0.1 + 0.9 * (1 + std::cos(M_PI * 0.3)) / 2, 1e-12);
}

TEST(LrSchedule, LinearWarmupThenMain) {
  auto s = make_schedule("cosine", 0.1, /*total_steps=*/15, /*warmup_steps=*/5, 0.1);
  EXPECT_NEAR(s->lr_at(0), 0.01, 1e-12);                 // start_factor * base
  EXPECT_NEAR(s->lr_at(2), 0.1 * (0.1 + 0.9 * 0.4), 1e-12);
  EXPECT_NEAR(s->lr_at(5), 0.1, 1e-12);                  // main schedule starts at its step 0
  EXPECT_NEAR(s->lr_at(10), 0.05, 1e-12);                // halfway through the 10 cosine steps
  EXPECT_NEAR(s->lr_at(15), 0.0, 1e-12);
  EXPECT_THROW(make_schedule("linear-ish", 0.1, 10, 0), Error);
}

}  // namespace
}  // namespace rg::optim
