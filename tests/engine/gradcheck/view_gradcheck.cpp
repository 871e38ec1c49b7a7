// f64 gradient checks for add/sub/mul/div (every broadcast form), neg/exp/log/sqrt/pow,
// sum/mean and views.
#include <gtest/gtest.h>

#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/reduce.h"
#include "engine/ops/unary.h"
#include "support/gradcheck.h"

namespace rg {
namespace {

using testing::gradcheck;
using testing::random_input;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Broadcast pairs: same shape, scalar tensor, per-channel (C,1,1) and bias (F).
const std::vector<std::pair<Shape, Shape>> kBroadcastPairs = {
    {{2, 3}, {2, 3}}, {{2, 3}, {1}}, {{1}, {2, 3}}, {{2, 3, 2, 2}, {3, 1, 1}},
    {{4, 5}, {5}},    {{3, 1}, {1, 4}}};

void check_binary(const Fn& f, double low = -1, double high = 1) {
  for (const auto& [sa, sb] : kBroadcastPairs) {
    Generator gen(sa.size() * 10 + sb.size());
    Tensor a = random_input(sa, gen, low, high);
    Tensor b = random_input(sb, gen, low, high);
    EXPECT_EQ(gradcheck(f, {a, b}), "") << shape_str(sa) << " op " << shape_str(sb);
  }
}

TEST(Gradcheck, Add) { check_binary([](auto& x) { return add(x[0], x[1]); }); }
TEST(Gradcheck, Sub) { check_binary([](auto& x) { return sub(x[0], x[1]); }); }
TEST(Gradcheck, Mul) { check_binary([](auto& x) { return mul(x[0], x[1]); }); }
TEST(Gradcheck, Div) { check_binary([](auto& x) { return div(x[0], x[1]); }, 0.5, 2.0); }

TEST(Gradcheck, ScalarForms) {
  Generator gen(3);
  Tensor a = random_input({3, 4}, gen, 0.5, 2.0);
  EXPECT_EQ(gradcheck([](auto& x) { return add(x[0], 1.5); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return mul(x[0], -2.0); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return rsub(x[0], 3.0); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return rdiv(x[0], 3.0); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return div(x[0], 4.0); }, {a}), "");
}

TEST(Gradcheck, Neg) {
  Generator gen(4);
  EXPECT_EQ(gradcheck([](auto& x) { return neg(x[0]); }, {random_input({5, 3}, gen)}), "");
}
TEST(Gradcheck, Exp) {
  Generator gen(5);
  EXPECT_EQ(gradcheck([](auto& x) { return exp(x[0]); }, {random_input({5, 3}, gen)}), "");
}
TEST(Gradcheck, Log) {
  Generator gen(6);
  EXPECT_EQ(gradcheck([](auto& x) { return log(x[0]); }, {random_input({5, 3}, gen, 0.5, 3)}),
            "");
}
TEST(Gradcheck, Sqrt) {
  Generator gen(7);
  EXPECT_EQ(gradcheck([](auto& x) { return sqrt(x[0]); }, {random_input({5, 3}, gen, 0.5, 3)}),
            "");
}
TEST(Gradcheck, PowScalar) {
  Generator gen(8);
  for (double p : {2.0, 3.0, 0.5, -1.5}) {
    Tensor a = random_input({4, 3}, gen, 0.5, 2.0);
    EXPECT_EQ(gradcheck([p](auto& x) { return pow(x[0], p); }, {a}), "") << "p=" << p;
  }
}

TEST(Gradcheck, SumAllAndDims) {
  Generator gen(9);
  Tensor a = random_input({2, 3, 4}, gen);
  EXPECT_EQ(gradcheck([](auto& x) { return sum(x[0]); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return sum(x[0], {1}); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return sum(x[0], {0, 2}, true); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return sum(x[0], {-1}); }, {a}), "");
}

TEST(Gradcheck, MeanAllAndDims) {
  Generator gen(10);
  Tensor a = random_input({2, 3, 4}, gen);
  EXPECT_EQ(gradcheck([](auto& x) { return mean(x[0]); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return mean(x[0], {0, 2}); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return mean(x[0], {1}, true); }, {a}), "");
}

TEST(Gradcheck, ViewNarrowClone) {
  Generator gen(11);
  Tensor a = random_input({4, 3}, gen);
  EXPECT_EQ(gradcheck([](auto& x) { return x[0].view({2, 6}); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return x[0].narrow(0, 1, 2); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return mul(x[0].clone(), x[0]); }, {a}), "");
}

}  // namespace
}  // namespace rg
