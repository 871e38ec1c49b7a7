// nn::LayerNorm: PyTorch's parameter names and initialization, and its forward is layer_norm's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/ops/factory.h"
#include "engine/ops/layer_norm.h"
#include "layers/layer_norm.h"
#include "support/errors.h"

namespace rg::nn {
namespace {

using rg::testing::expect_error;

TEST(LayerNormModule, ParameterNamesInitAndForward) {
  LayerNorm ln(5);
  const NamedTensors params = ln.named_parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].first, "weight");
  EXPECT_EQ(params[1].first, "bias");
  EXPECT_EQ(ln.weight.shape(), (Shape{5}));
  EXPECT_EQ(ln.weight.dtype(), DType::f32);
  EXPECT_EQ(ln.weight.to_vector<float>(), std::vector<float>(5, 1.0f));
  EXPECT_EQ(ln.bias.to_vector<float>(), std::vector<float>(5, 0.0f));
  EXPECT_TRUE(ln.weight.requires_grad() && ln.bias.requires_grad());

  const Tensor x = arange(30, DType::f32).view({2, 3, 5});
  EXPECT_EQ(ln(x).to_vector<float>(), layer_norm(x, ln.weight, ln.bias).to_vector<float>());
  EXPECT_EQ(ln(x).shape(), (Shape{2, 3, 5}));
  EXPECT_NE(ln.str().find("LayerNorm((5,), eps=1e-05, elementwise_affine=True)"),
            std::string::npos)
      << ln.str();
  expect_error([&] { ln(zeros({2, 4})); }, "LayerNorm(5): expected an input [..., 5]");
}

TEST(LayerNormModule, WithoutAffineHasNoParameters) {
  LayerNorm ln(4, 1e-3, false);
  EXPECT_TRUE(ln.named_parameters().empty());
  const Tensor x = arange(8, DType::f32).view({2, 4});
  EXPECT_EQ(ln(x).to_vector<float>(), layer_norm(x, Tensor(), Tensor(), 1e-3).to_vector<float>());
}

}  // namespace
}  // namespace rg::nn
