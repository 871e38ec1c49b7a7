// f64 gradient checks for max/avg/adaptive pooling and batch_norm (training and eval).
#include <gtest/gtest.h>

#include "engine/ops/batch_norm.h"
#include "engine/ops/factory.h"
#include "engine/ops/pool.h"
#include "support/gradcheck.h"

namespace rg {
namespace {

using testing::gradcheck;
using testing::random_input;

TEST(Gradcheck, MaxPool2d) {
  // Distinct random values: no ties, so the max is differentiable at the test point.
  Generator gen(21);
  Tensor x = random_input({2, 3, 5, 6}, gen);
  EXPECT_EQ(gradcheck([](auto& v) { return max_pool2d(v[0], {2, 2}); }, {x}), "");
  EXPECT_EQ(gradcheck([](auto& v) { return max_pool2d(v[0], {3, 3}, {2, 2}, {1, 1}); }, {x}), "");
  EXPECT_EQ(gradcheck([](auto& v) { return max_pool2d(v[0], {2, 3}, {1, 2}); }, {x}), "");
}

TEST(Gradcheck, AvgPool2d) {
  Generator gen(22);
  Tensor x = random_input({2, 2, 5, 5}, gen);
  EXPECT_EQ(gradcheck([](auto& v) { return avg_pool2d(v[0], {2, 2}); }, {x}), "");
  EXPECT_EQ(gradcheck([](auto& v) { return avg_pool2d(v[0], {3, 3}, {2, 2}, {1, 1}); }, {x}), "");
  EXPECT_EQ(gradcheck([](auto& v) { return avg_pool2d(v[0], {3, 3}, {2, 2}, {1, 1}, false); },
                      {x}),
            "");
}

TEST(Gradcheck, AdaptiveAvgPool2d) {
  Generator gen(23);
  Tensor x = random_input({2, 3, 4, 3}, gen);
  EXPECT_EQ(gradcheck([](auto& v) { return adaptive_avg_pool2d(v[0], {1, 1}); }, {x}), "");
}

TEST(Gradcheck, BatchNormTraining) {
  Generator gen(24);
  Tensor x = random_input({3, 2, 3, 2}, gen);
  Tensor w = random_input({2}, gen, 0.5, 1.5);
  Tensor b = random_input({2}, gen);
  // Without running stats so that repeated evaluations see identical state.
  EXPECT_EQ(gradcheck([](auto& v) { return batch_norm(v[0], {}, {}, v[1], v[2], true); },
                      {x, w, b}),
            "");
  Tensor x2 = random_input({5, 3}, gen);  // the [N, C] form
  Tensor w2 = random_input({3}, gen, 0.5, 1.5);
  Tensor b2 = random_input({3}, gen);
  EXPECT_EQ(gradcheck([](auto& v) { return batch_norm(v[0], {}, {}, v[1], v[2], true); },
                      {x2, w2, b2}),
            "");
  // No affine parameters.
  EXPECT_EQ(gradcheck([](auto& v) { return batch_norm(v[0], {}, {}, {}, {}, true); }, {x}), "");
}

TEST(Gradcheck, BatchNormEval) {
  Generator gen(25);
  Tensor x = random_input({3, 2, 2, 2}, gen);
  Tensor w = random_input({2}, gen, 0.5, 1.5);
  Tensor b = random_input({2}, gen);
  Tensor rm = from_vector<double>({0.1, -0.2}, {2});
  Tensor rv = from_vector<double>({0.5, 2.0}, {2});
  EXPECT_EQ(gradcheck([&](auto& v) { return batch_norm(v[0], rm, rv, v[1], v[2], false); },
                      {x, w, b}),
            "");
}

}  // namespace
}  // namespace rg
