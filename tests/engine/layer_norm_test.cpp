// layer_norm against hand-computed rows (the op table checks gradients, devices and dtypes).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/ops/factory.h"
#include "engine/ops/layer_norm.h"
#include "engine/ops/reduce.h"
#include "support/errors.h"

namespace rg {
namespace {

using testing::expect_error;

// x = [[1, 2, 3, 4], [-1, 0, 0, 5]]: row 0 has mean 2.5 and biased variance 1.25, row 1 mean 1
// and variance (4 + 1 + 1 + 16) / 4 = 5.5.
const std::vector<double> kX = {1, 2, 3, 4, -1, 0, 0, 5};

std::vector<double> normalized_rows(double eps) {
  std::vector<double> y;
  for (int i = 0; i < 4; ++i) y.push_back((kX[size_t(i)] - 2.5) / std::sqrt(1.25 + eps));
  for (int i = 4; i < 8; ++i) y.push_back((kX[size_t(i)] - 1.0) / std::sqrt(5.5 + eps));
  return y;
}

TEST(LayerNorm, HandComputedRowsInF64AndF32) {
  const std::vector<double> want = normalized_rows(1e-5);
  const Tensor x = from_vector<double>(kX, {2, 4});
  const std::vector<double> got = layer_norm(x).to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-14) << i;
  const std::vector<float> got32 = layer_norm(x.to(DType::f32)).to_vector<float>();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got32[i], want[i], 1e-6) << i;

  // weight and bias per column, and another eps.
  const std::vector<double> w = {1, 2, 0.5, -1}, b = {0, 1, 0, -2};
  const std::vector<double> plain = normalized_rows(1e-2);
  const std::vector<double> affine =
      layer_norm(x, from_vector<double>(w, {4}), from_vector<double>(b, {4}), 1e-2)
          .to_vector<double>();
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_NEAR(affine[i], plain[i] * w[i % 4] + b[i % 4], 1e-14) << i;
}

TEST(LayerNorm, GradientsOfTheSum) {
  // sum(y) = sum(xhat * w + b): each row's xhat sums to 0 whatever x is, so with w = 1 the input
  // gradient is 0, gweight[j] = sum over rows of xhat[:, j] and gbias[j] = the row count.
  Tensor x = from_vector<double>(kX, {2, 4});
  Tensor w = ones({4}, DType::f64), b = zeros({4}, DType::f64);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  sum(layer_norm(x, w, b)).backward();
  const std::vector<double> xhat = normalized_rows(1e-5);
  const std::vector<double> gx = x.grad().to_vector<double>(), gw = w.grad().to_vector<double>();
  const std::vector<double> gb = b.grad().to_vector<double>();
  for (size_t i = 0; i < gx.size(); ++i) EXPECT_NEAR(gx[i], 0.0, 1e-14) << i;
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_NEAR(gw[j], xhat[j] + xhat[j + 4], 1e-14) << j;
    EXPECT_EQ(gb[j], 2.0) << j;
  }
}

TEST(LayerNorm, ShapeErrors) {
  expect_error([] { layer_norm(zeros({})); }, "layer_norm: expected an input of at least 1");
  expect_error([] { layer_norm(zeros({2, 3}), ones({4})); }, "layer_norm: weight has shape");
  expect_error([] { layer_norm(zeros({2, 3}), ones({3}), zeros({2})); },
               "layer_norm: bias has shape");
}

}  // namespace
}  // namespace rg
