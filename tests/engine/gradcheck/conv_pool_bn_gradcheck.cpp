// f64 gradient checks for conv2d (stride/padding/dilation, bias, non-square kernels, the 1x1 fast
// path, the row-block and batched-chunk paths), max/avg/adaptive pooling and batch_norm.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <sstream>

#include "engine/ops/batch_norm.h"
#include "engine/ops/conv2d.h"
#include "engine/ops/factory.h"
#include "engine/ops/pool.h"
#include "support/gradcheck.h"

namespace rg {
namespace {

using testing::gradcheck;
using testing::random_input;
using Pair = std::array<int64_t, 2>;

struct ConvCase {
  Shape x, w;
  Pair stride, padding, dilation;
  bool bias;
};

std::string describe(const ConvCase& c) {
  std::ostringstream os;
  os << shape_str(c.x) << " * " << shape_str(c.w) << " stride (" << c.stride[0] << ", "
     << c.stride[1] << ") padding (" << c.padding[0] << ", " << c.padding[1] << ") dilation ("
     << c.dilation[0] << ", " << c.dilation[1] << ")" << (c.bias ? " with bias" : "");
  return os.str();
}

void check_conv(const ConvCase& c, uint64_t seed) {
  Generator gen(seed);
  std::vector<Tensor> inputs{random_input(c.x, gen), random_input(c.w, gen)};
  if (c.bias) inputs.push_back(random_input({c.w[0]}, gen));
  auto f = [&c](const std::vector<Tensor>& in) {
    return conv2d(in[0], in[1], c.bias ? in[2] : Tensor(), c.stride, c.padding, c.dilation);
  };
  EXPECT_EQ(gradcheck(f, inputs), "") << describe(c);
}

// Stride 1 takes the input gradient as a flipped-weight convolution, strided or over-padded
// convolutions take GEMM + col2im; both with and without bias.
TEST(Gradcheck, Conv2dStridePaddingDilation) {
  const std::vector<ConvCase> cases = {
      {{2, 3, 5, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, true},
      {{2, 3, 5, 6}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, false},
      {{2, 2, 7, 6}, {3, 2, 3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
      {{2, 2, 7, 6}, {3, 2, 3, 3}, {2, 3}, {1, 0}, {1, 1}, true},
      {{2, 2, 7, 7}, {2, 2, 3, 3}, {1, 1}, {2, 2}, {2, 2}, true},
      {{1, 2, 8, 7}, {3, 2, 3, 2}, {1, 2}, {0, 1}, {2, 1}, false},
  };
  for (size_t i = 0; i < cases.size(); ++i) check_conv(cases[i], 100 + i);
}

TEST(Gradcheck, Conv2dNonSquareKernels) {
  check_conv({{2, 2, 6, 7}, {3, 2, 2, 3}, {1, 1}, {0, 1}, {1, 1}, true}, 110);
  check_conv({{2, 2, 6, 7}, {3, 2, 1, 4}, {2, 1}, {0, 2}, {1, 1}, false}, 111);
  check_conv({{1, 3, 5, 5}, {2, 3, 5, 1}, {1, 1}, {2, 0}, {1, 1}, true}, 112);
}

// 1x1 kernels: the direct path (no im2col) when a sample has >= 512 pixels, batched columns for
// small maps, and the strided / padded 1x1 forms of ResNet shortcuts.
TEST(Gradcheck, Conv2dOneByOne) {
  check_conv({{2, 2, 16, 32}, {3, 2, 1, 1}, {1, 1}, {0, 0}, {1, 1}, true}, 120);
  check_conv({{3, 3, 4, 5}, {2, 3, 1, 1}, {1, 1}, {0, 0}, {1, 1}, false}, 121);
  check_conv({{2, 3, 6, 6}, {4, 3, 1, 1}, {2, 2}, {0, 0}, {1, 1}, false}, 122);
  check_conv({{2, 2, 4, 4}, {2, 2, 1, 1}, {1, 1}, {1, 1}, {1, 1}, true}, 123);
}

// Stride 1 on maps wide enough that the forward (and the input gradient, itself a stride-1
// convolution) skip im2col and run one GEMM per kernel tap.
TEST(Gradcheck, Conv2dWideMapsWithoutIm2col) {
  check_conv({{2, 2, 4, 34}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, true}, 140);
  check_conv({{1, 2, 5, 36}, {2, 2, 2, 3}, {1, 1}, {0, 1}, {1, 1}, false}, 141);
  check_conv({{1, 2, 5, 64}, {2, 2, 3, 3}, {1, 1}, {2, 2}, {2, 2}, true}, 142);
}

// One sample is split into row blocks (one per thread); five samples give uneven chunks.
TEST(Gradcheck, Conv2dSingleSampleAndOddBatch) {
  check_conv({{1, 2, 9, 5}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, true}, 130);
  check_conv({{1, 2, 9, 5}, {3, 2, 3, 3}, {2, 1}, {1, 1}, {1, 1}, true}, 131);
  check_conv({{5, 2, 4, 4}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, false}, 132);
}

// A [N, C, H, W] f64 leaf holding a shuffled 0.1-spaced ramp: every value distinct and far
// apart compared with the finite-difference step, so no max-pool window has a near-tie.
Tensor distinct_input(const Shape& shape, uint64_t seed) {
  std::vector<double> values(size_t(shape_numel(shape)));
  std::iota(values.begin(), values.end(), 0.0);
  std::shuffle(values.begin(), values.end(), std::mt19937_64(seed));
  for (double& v : values) v = 0.1 * v - 1.0;
  Tensor t = from_vector<double>(values, shape);
  t.set_requires_grad(true);
  return t;
}

TEST(Gradcheck, MaxPool2dDistinctValues) {
  const Tensor x = distinct_input({2, 3, 7, 6}, 140);
  EXPECT_EQ(gradcheck([](auto& in) { return max_pool2d(in[0], {2, 2}); }, {x}), "");
  EXPECT_EQ(gradcheck([](auto& in) { return max_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}); }, {x}), "");
  // Overlapping windows (stride < kernel): one input may be the maximum of several windows.
  EXPECT_EQ(gradcheck([](auto& in) { return max_pool2d(in[0], {3, 2}, {1, 1}, {1, 0}); }, {x}), "");
}

TEST(Gradcheck, AvgPool2dPaddingAndExcludePad) {
  Generator gen(150);
  const Tensor x = random_input({2, 3, 7, 6}, gen);
  EXPECT_EQ(gradcheck([](auto& in) { return avg_pool2d(in[0], {2, 2}); }, {x}), "");
  EXPECT_EQ(gradcheck([](auto& in) { return avg_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}); }, {x}), "");
  EXPECT_EQ(gradcheck(
                [](auto& in) {
                  return avg_pool2d(in[0], {3, 2}, {1, 2}, {1, 1}, false);
                },
                {x}),
            "");
}

TEST(Gradcheck, AdaptiveAvgPool2dGlobal) {
  Generator gen(160);
  EXPECT_EQ(gradcheck(
                [](auto& in) {
                  return adaptive_avg_pool2d(in[0], {1, 1});
                },
                {random_input({3, 4, 5, 3}, gen)}),
            "");
}

TEST(Gradcheck, BatchNorm2dTraining) {
  Generator gen(170);
  const Tensor x = random_input({3, 4, 3, 2}, gen, -2, 3);
  const Tensor w = random_input({4}, gen, 0.5, 1.5);
  const Tensor b = random_input({4}, gen);
  Tensor rm = zeros({4}, DType::f64), rv = ones({4}, DType::f64);
  EXPECT_EQ(
      gradcheck([&](auto& in) { return batch_norm(in[0], rm, rv, in[1], in[2], true); }, {x, w, b}),
      "");
  // Without affine parameters or running statistics.
  EXPECT_EQ(
      gradcheck(
          [](auto& in) { return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true); },
          {x}),
      "");
}

TEST(Gradcheck, BatchNorm1dTraining) {
  Generator gen(171);
  const Tensor x = random_input({6, 5}, gen, -1, 2);
  const Tensor w = random_input({5}, gen, 0.5, 1.5);
  const Tensor b = random_input({5}, gen);
  EXPECT_EQ(gradcheck(
                [](auto& in) {
                  return batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true, 0.1, 1e-3);
                },
                {x, w, b}),
            "");
}

TEST(Gradcheck, BatchNormEvalRunningStats) {
  Generator gen(172);
  const Tensor x = random_input({3, 4, 2, 3}, gen);
  const Tensor w = random_input({4}, gen, 0.5, 1.5);
  const Tensor b = random_input({4}, gen);
  const Tensor rm = from_vector<double>({0.1, -0.2, 0.3, 0.0}, {4});
  const Tensor rv = from_vector<double>({0.5, 1.5, 2.0, 0.8}, {4});
  EXPECT_EQ(gradcheck([&](auto& in) { return batch_norm(in[0], rm, rv, in[1], in[2], false); },
                      {x, w, b}),
            "");
}

}  // namespace
}  // namespace rg
