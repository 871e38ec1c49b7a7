// f64 gradient checks for the neural-network ops: activations, matmul/linear, dropout, flatten,
// log_softmax, nll_loss and cross_entropy.
#include <gtest/gtest.h>

#include "engine/ops/activation.h"
#include "engine/ops/dropout.h"
#include "engine/ops/factory.h"
#include "engine/ops/flatten.h"
#include "engine/ops/loss.h"
#include "engine/ops/matmul.h"
#include "support/gradcheck.h"

namespace rg {
namespace {

using testing::gradcheck;
using testing::random_input;

// Values in [0.1, 1.5) with a random sign: the relu kinks at 0 stay far from every +-eps probe.
Tensor away_from_zero(const Shape& shape, Generator& gen) {
  Tensor magnitude = random_input(shape, gen, 0.1, 1.5);
  Tensor sign = rand(shape, gen, DType::f64);
  double* m = magnitude.data<double>();
  const double* s = sign.data<double>();
  for (int64_t i = 0; i < magnitude.numel(); ++i) m[i] = s[i] < 0.5 ? -m[i] : m[i];
  return magnitude;
}

// Class indices in [0, c) for n rows, drawn from `gen`.
Tensor random_targets(int64_t n, int64_t c, Generator& gen) {
  Tensor u = rand({n}, gen, DType::f64);
  std::vector<int64_t> t;
  for (double v : u.to_vector<double>()) t.push_back(int64_t(v * double(c)));
  return from_vector<int64_t>(t, {n});
}

TEST(Gradcheck, Relu) {
  Generator gen(21);
  EXPECT_EQ(gradcheck([](auto& x) { return relu(x[0]); }, {away_from_zero({4, 5}, gen)}), "");
}

TEST(Gradcheck, LeakyRelu) {
  Generator gen(22);
  Tensor a = away_from_zero({4, 5}, gen);
  EXPECT_EQ(gradcheck([](auto& x) { return leaky_relu(x[0]); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return leaky_relu(x[0], 0.2); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return leaky_relu(x[0], -0.5); }, {a}), "");
}

TEST(Gradcheck, Gelu) {
  Generator gen(23);
  Tensor a = random_input({4, 5}, gen, -3.0, 3.0);
  EXPECT_EQ(gradcheck([](auto& x) { return gelu(x[0]); }, {a}), "") << "exact";
  EXPECT_EQ(gradcheck([](auto& x) { return gelu(x[0], true); }, {a}), "") << "tanh";
}

TEST(Gradcheck, Sigmoid) {
  Generator gen(24);
  EXPECT_EQ(gradcheck([](auto& x) { return sigmoid(x[0]); }, {random_input({4, 5}, gen, -4, 4)}),
            "");
}

TEST(Gradcheck, Tanh) {
  Generator gen(25);
  EXPECT_EQ(gradcheck([](auto& x) { return tanh(x[0]); }, {random_input({4, 5}, gen, -2, 2)}), "");
}

TEST(Gradcheck, Matmul) {
  Generator gen(26);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 4}, {4, 5}},       {{4}, {4, 2}},       {{3, 4}, {4}},       {{4}, {4}},
      {{2, 3, 4}, {2, 4, 5}}, {{2, 3, 4}, {4, 5}}, {{3, 4}, {2, 4, 5}}, {{4}, {2, 4, 3}}};
  for (const auto& [sa, sb] : cases) {
    Tensor a = random_input(sa, gen);
    Tensor b = random_input(sb, gen);
    EXPECT_EQ(gradcheck([](auto& x) { return matmul(x[0], x[1]); }, {a, b}), "")
        << shape_str(sa) << " x " << shape_str(sb);
  }
}

TEST(Gradcheck, Linear) {
  Generator gen(27);
  Tensor x = random_input({5, 3}, gen);
  Tensor w = random_input({4, 3}, gen);
  Tensor b = random_input({4}, gen);
  EXPECT_EQ(gradcheck([](auto& v) { return linear(v[0], v[1], v[2]); }, {x, w, b}), "")
      << "with bias";
  EXPECT_EQ(gradcheck([](auto& v) { return linear(v[0], v[1]); }, {x, w}), "") << "no bias";
  Tensor x3 = random_input({2, 3, 3}, gen);  // leading dimensions are flattened into rows
  EXPECT_EQ(gradcheck([](auto& v) { return linear(v[0], v[1], v[2]); }, {x3, w, b}), "")
      << "3-d input";
}

TEST(Gradcheck, Dropout) {
  Generator gen(28);
  Tensor a = random_input({6, 7}, gen);
  // A fresh generator per evaluation: every finite-difference probe sees the same mask.
  EXPECT_EQ(gradcheck(
                [](auto& x) {
                  Generator g(99);
                  return dropout(x[0], 0.4, true, g);
                },
                {a}),
            "");
}

TEST(Gradcheck, Flatten) {
  Generator gen(29);
  Tensor a = random_input({2, 3, 2, 2}, gen);
  EXPECT_EQ(gradcheck([](auto& x) { return flatten(x[0]); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return flatten(x[0], 1, 2); }, {a}), "");
}

TEST(Gradcheck, LogSoftmax) {
  Generator gen(30);
  Tensor a = random_input({3, 4, 5}, gen, -2, 2);
  for (int64_t dim : {0, 1, 2, -1}) {
    EXPECT_EQ(gradcheck([dim](auto& x) { return log_softmax(x[0], dim); }, {a}), "")
        << "dim " << dim;
  }
  Tensor rows = random_input({4, 6}, gen, -2, 2);  // the [N, C] fast path
  EXPECT_EQ(gradcheck([](auto& x) { return log_softmax(x[0], 1); }, {rows}), "");
}

TEST(Gradcheck, NllLoss) {
  Generator gen(31);
  Tensor logp = random_input({5, 4}, gen, -3, 0);
  Tensor target = random_targets(5, 4, gen);
  EXPECT_EQ(gradcheck([&](auto& x) { return nll_loss(x[0], target); }, {logp}), "");
  EXPECT_EQ(gradcheck([&](auto& x) { return nll_loss(log_softmax(x[0], 1), target); }, {logp}), "");
}

TEST(Gradcheck, CrossEntropy) {
  Generator gen(32);
  Tensor logits = random_input({6, 5}, gen, -2, 2);
  Tensor target = random_targets(6, 5, gen);
  for (double eps : {0.0, 0.1, 1.0}) {
    EXPECT_EQ(gradcheck([&](auto& x) { return cross_entropy(x[0], target, eps); }, {logits}), "")
        << "label_smoothing " << eps;
  }
}

}  // namespace
}  // namespace rg
