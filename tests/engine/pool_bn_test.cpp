// Pooling and batch_norm forward values worked out by hand, and their input errors.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/ops/batch_norm.h"
#include "engine/ops/factory.h"
#include "engine/ops/pool.h"
#include "kernels/error.h"

namespace rg {
namespace {

TEST(Pool, MaxPoolWithPaddingByHand) {
  // 1x1x3x3 input 0..8, kernel 2, stride 2, padding 1: windows cover
  // {0}, {1,2}, {3,6}, {4,5,7,8} -> 0, 2, 6, 8.
  Tensor x = arange(9, DType::f32).view({1, 1, 3, 3});
  EXPECT_EQ(max_pool2d(x, {2, 2}, {2, 2}, {1, 1}).to_vector<float>(),
            (std::vector<float>{0, 2, 6, 8}));
  // Negative inputs: padding must act as -inf, not 0.
  Tensor neg = full({1, 1, 2, 2}, -3.0);
  EXPECT_EQ(max_pool2d(neg, {2, 2}, {1, 1}, {1, 1}).to_vector<float>(),
            std::vector<float>(9, -3.0f));
}

TEST(Pool, AvgPoolCountIncludePad) {
  // Same windows as above: with padding counted every window divides by 4.
  Tensor x = arange(9, DType::f32).view({1, 1, 3, 3});
  EXPECT_EQ(avg_pool2d(x, {2, 2}, {2, 2}, {1, 1}).to_vector<float>(),
            (std::vector<float>{0 / 4.f, 3 / 4.f, 9 / 4.f, 24 / 4.f}));
  EXPECT_EQ(avg_pool2d(x, {2, 2}, {2, 2}, {1, 1}, false).to_vector<float>(),
            (std::vector<float>{0, 1.5, 4.5, 6}));
}

TEST(Pool, MaxPoolBackwardRoutesToArgmax) {
  Tensor x = from_vector<float>({1, 5, 3, 2}, {1, 1, 2, 2});
  x.set_requires_grad(true);
  max_pool2d(x, {2, 2}).backward(ones({1, 1, 1, 1}));
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{0, 1, 0, 0}));
}

TEST(Pool, Errors) {
  Tensor x = zeros({1, 1, 3, 3});
  EXPECT_THROW(max_pool2d(zeros({3, 3}), {2, 2}), Error);
  EXPECT_THROW(max_pool2d(x, {4, 4}), Error);                  // larger than the input
  EXPECT_THROW(max_pool2d(x, {2, 2}, {1, 1}, {2, 2}), Error);  // padding > kernel / 2
  EXPECT_THROW(adaptive_avg_pool2d(x, {2, 2}), Error);
}

TEST(BatchNorm, TrainingNormalizesAndUpdatesRunningStats) {
  // Channel 0: 1, 3, 5, 7 (mean 4, biased var 5, unbiased 20/3); channel 1: all 2.
  Tensor x = from_vector<float>({1, 3, 2, 2, 5, 7, 2, 2}, {2, 2, 2, 1});
  Tensor rm = zeros({2}), rv = ones({2});
  Tensor y =
      batch_norm(x, rm, rv, ones({2}), from_vector<float>({0.5f, -1.f}, {2}), true, 0.1, 1e-5);
  const auto v = y.to_vector<float>();
  EXPECT_NEAR(v[0], (1 - 4) / std::sqrt(5 + 1e-5) + 0.5, 1e-5);
  EXPECT_NEAR(v[5], (7 - 4) / std::sqrt(5 + 1e-5) + 0.5, 1e-5);
  EXPECT_NEAR(v[2], -1.0, 1e-6);  // constant channel: 0 * invstd + bias
  EXPECT_NEAR(rm.to_vector<float>()[0], 0.4, 1e-6);
  EXPECT_NEAR(rv.to_vector<float>()[0], 0.9 + 0.1 * 20.0 / 3.0, 1e-6);
  EXPECT_NEAR(rv.to_vector<float>()[1], 0.9, 1e-6);
}

TEST(BatchNorm, Errors) {
  EXPECT_THROW(batch_norm(zeros({2, 3, 2, 2}), zeros({2}), ones({2}), {}, {}, true), Error);
  EXPECT_THROW(batch_norm(zeros({2, 3}), {}, {}, {}, {}, false), Error);  // eval needs stats
  EXPECT_THROW(batch_norm(zeros({1, 3}), {}, {}, {}, {}, true), Error);   // one value/channel
  EXPECT_THROW(batch_norm(zeros({2, 3, 4}), {}, {}, {}, {}, true), Error);
}

}  // namespace
}  // namespace rg
