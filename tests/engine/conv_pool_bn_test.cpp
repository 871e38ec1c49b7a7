// conv2d, pooling and batch_norm forward values worked out by hand, conv2d forward and backward
// against a direct-convolution loop written here, and the errors for bad shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "engine/autograd/grad_mode.h"
#include "engine/ops/batch_norm.h"
#include "engine/ops/conv2d.h"
#include "engine/ops/factory.h"
#include "engine/ops/pool.h"
#include "kernels/cpu/parallel.h"
#include "kernels/error.h"
#include "support/errors.h"

namespace rg {
namespace {

using Pair = std::array<int64_t, 2>;

void expect_near_all(const std::vector<double>& actual, const std::vector<double>& expected,
                     double tol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], tol * (1 + std::fabs(expected[i])))
        << what << " element " << i;
  }
}

using testing::expect_error;

// ---- conv2d by hand ----

// x = [[1, 2, 3], [4, 5, 6], [7, 8, 9]], w = [[1, 2], [3, 4]]:
// out[i][j] = x[i][j] + 2 x[i][j+1] + 3 x[i+1][j] + 4 x[i+1][j+1].
TEST(Conv2d, HandComputedSingleChannel) {
  const Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  const Tensor w = from_vector<float>({1, 2, 3, 4}, {1, 1, 2, 2});
  const Tensor y = conv2d(x, w);
  EXPECT_EQ(y.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{37, 47, 67, 77}));
  const Tensor yb = conv2d(x, w, from_vector<float>({0.5f}, {1}));
  EXPECT_EQ(yb.to_vector<float>(), (std::vector<float>{37.5f, 47.5f, 67.5f, 77.5f}));
  // Padding 1, stride 2 reads the zero-padded 5x5 input at rows/cols 0 and 2:
  // [[0,0],[0,1]] -> 4, [[0,0],[2,3]] -> 18, [[0,4],[0,7]] -> 36, [[5,6],[8,9]] -> 77.
  const Tensor ys = conv2d(x, w, Tensor(), {2, 2}, {1, 1});
  EXPECT_EQ(ys.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(ys.to_vector<float>(), (std::vector<float>{4, 18, 36, 77}));
  // Dilation 2 with a 2x2 kernel touches the four corners: 1 + 2*3 + 3*7 + 4*9 = 64.
  EXPECT_EQ(conv2d(x, w, Tensor(), {1, 1}, {0, 0}, {2, 2}).to_vector<float>(),
            (std::vector<float>{64}));
}

// Two input channels and two output channels: each output sums its channels' contributions.
TEST(Conv2d, HandComputedChannelsSum) {
  const Tensor x = from_vector<double>({1, 2, 3, 4, 10, 20, 30, 40}, {1, 2, 2, 2});
  // Output 0: 1x1 weights (1, 1) -> x0 + x1; output 1: (2, -1) -> 2 x0 - x1.
  const Tensor w = from_vector<double>({1, 1, 2, -1}, {2, 2, 1, 1});
  EXPECT_EQ(conv2d(x, w).to_vector<double>(),
            (std::vector<double>{11, 22, 33, 44, -8, -16, -24, -32}));
}

// ---- conv2d against a direct convolution ----

struct Reference {
  std::vector<double> y, gx, gw, gb;
};

// The textbook loops: y[n,o,i,j] = b[o] + sum_{c,ki,kj} x[n,c,i*sh-ph+ki*dh, j*sw-pw+kj*dw]
// * w[o,c,ki,kj], and their adjoints for gy.
Reference direct_conv(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w,
                      const Shape& ws, const std::vector<double>& b, Pair st, Pair pad, Pair dil,
                      const std::vector<double>& gy) {
  const int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3], o = ws[0], kh = ws[2], kw = ws[3];
  const int64_t ho = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) / st[0] + 1;
  const int64_t wo = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) / st[1] + 1;
  Reference r{std::vector<double>(size_t(n * o * ho * wo)), std::vector<double>(x.size()),
              std::vector<double>(w.size()), std::vector<double>(size_t(o))};
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t oc = 0; oc < o; ++oc) {
      for (int64_t i = 0; i < ho; ++i) {
        for (int64_t j = 0; j < wo; ++j) {
          const size_t yi = size_t(((s * o + oc) * ho + i) * wo + j);
          double acc = b.empty() ? 0.0 : b[size_t(oc)];
          for (int64_t ci = 0; ci < c; ++ci) {
            for (int64_t ki = 0; ki < kh; ++ki) {
              for (int64_t kj = 0; kj < kw; ++kj) {
                const int64_t ih = i * st[0] - pad[0] + ki * dil[0];
                const int64_t iw = j * st[1] - pad[1] + kj * dil[1];
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                const size_t xi = size_t(((s * c + ci) * h + ih) * wd + iw);
                const size_t wi = size_t(((oc * c + ci) * kh + ki) * kw + kj);
                acc += x[xi] * w[wi];
                r.gx[xi] += gy[yi] * w[wi];
                r.gw[wi] += gy[yi] * x[xi];
              }
            }
          }
          r.y[yi] = acc;
          r.gb[size_t(oc)] += gy[yi];
        }
      }
    }
  }
  return r;
}

struct ConvShape {
  Shape x, w;
  Pair stride, padding, dilation;
};

void check_against_direct(const ConvShape& cs, DType dtype, uint64_t seed) {
  Generator gen(seed);
  Tensor x = rand(cs.x, gen, dtype), w = rand(cs.w, gen, dtype), b = rand({cs.w[0]}, gen, dtype);
  // Centre the values so that sums cancel as in real layers.
  const auto centred = [&](const Tensor& t) {
    std::vector<double> v = t.to_vector<double>();
    for (double& e : v) e = e - 0.5;
    return v;
  };
  const std::vector<double> xv = centred(x), wv = centred(w), bv = centred(b);
  x = from_vector<double>(xv, cs.x, dtype).set_requires_grad(true);
  w = from_vector<double>(wv, cs.w, dtype).set_requires_grad(true);
  b = from_vector<double>(bv, {cs.w[0]}, dtype).set_requires_grad(true);
  Tensor y = conv2d(x, w, b, cs.stride, cs.padding, cs.dilation);
  const Tensor gy_t = rand(y.shape(), gen, dtype);
  const std::vector<double> gy = gy_t.to_vector<double>();
  y.backward(gy_t);
  const Reference r = direct_conv(xv, cs.x, wv, cs.w, bv, cs.stride, cs.padding, cs.dilation, gy);
  const double tol = dtype == DType::f64 ? 1e-10 : 2e-4;
  const std::string what = shape_str(cs.x) + " * " + shape_str(cs.w) + " " + dtype_name(dtype);
  expect_near_all(y.to_vector<double>(), r.y, tol, what + " y");
  expect_near_all(x.grad().to_vector<double>(), r.gx, tol, what + " dx");
  expect_near_all(w.grad().to_vector<double>(), r.gw, tol, what + " dw");
  expect_near_all(b.grad().to_vector<double>(), r.gb, tol, what + " db");
}

// Covers every kernel path: flipped-weight input gradient (stride 1), col2im (strided or
// over-padded), the 1x1 direct path, batched chunks of small maps, row blocks of one sample
// (batch 1, and f32 64ch 32x32 / f64 32ch 32x32 whose columns exceed the chunk budget), and the
// im2col-free tap path of stride-1 convolutions on wide maps (the last four).
const std::vector<ConvShape> kConvShapes = {
    {{2, 3, 7, 9}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}},
    {{3, 4, 9, 8}, {5, 4, 3, 3}, {2, 2}, {1, 1}, {1, 1}},
    {{2, 3, 10, 7}, {2, 3, 2, 3}, {3, 2}, {0, 2}, {1, 1}},
    {{2, 2, 9, 9}, {3, 2, 3, 3}, {1, 1}, {2, 2}, {2, 2}},
    {{2, 3, 8, 11}, {2, 3, 3, 2}, {1, 2}, {1, 0}, {2, 3}},
    {{2, 4, 16, 32}, {6, 4, 1, 1}, {1, 1}, {0, 0}, {1, 1}},
    {{3, 4, 5, 5}, {6, 4, 1, 1}, {2, 2}, {0, 0}, {1, 1}},
    {{2, 3, 5, 4}, {2, 3, 1, 1}, {1, 1}, {1, 1}, {1, 1}},
    {{9, 16, 4, 4}, {8, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}},
    {{1, 3, 13, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}},
    {{1, 3, 13, 6}, {4, 3, 3, 3}, {2, 1}, {1, 1}, {1, 1}},
    {{2, 64, 32, 32}, {4, 64, 3, 3}, {1, 1}, {1, 1}, {1, 1}},
    {{2, 3, 6, 40}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}},
    {{1, 3, 7, 64}, {2, 3, 3, 3}, {1, 1}, {2, 2}, {2, 2}},
    {{3, 2, 5, 40}, {3, 2, 2, 3}, {1, 1}, {0, 1}, {1, 1}},
};

TEST(Conv2d, MatchesDirectConvolutionF64) {
  for (size_t i = 0; i < kConvShapes.size(); ++i) {
    ConvShape cs = kConvShapes[i];
    if (cs.x[1] == 64)
      cs.x[1] = cs.w[1] = 32;  // f64 columns exceed the budget at half the channels
    check_against_direct(cs, DType::f64, 300 + i);
  }
}

TEST(Conv2d, MatchesDirectConvolutionF32) {
  for (size_t i = 0; i < kConvShapes.size(); ++i) {
    check_against_direct(kConvShapes[i], DType::f32, 400 + i);
  }
}

// One thread: one worker, OpenBLAS's own threading and parallel_for in the copies.
TEST(Conv2d, MatchesDirectConvolutionSingleThread) {
  const int saved = kernels::cpu::num_threads();
  kernels::cpu::set_num_threads(1);
  for (size_t i = 0; i < kConvShapes.size(); ++i) {
    check_against_direct(kConvShapes[i], DType::f64, 500 + i);
  }
  kernels::cpu::set_num_threads(saved);
}

// Chunks are split among threads in a fixed way, so training runs repeat bit for bit.
TEST(Conv2d, RepeatedRunsAreBitwiseIdentical) {
  Generator gen(11);
  const Tensor x0 = rand({8, 32, 16, 16}, gen), w0 = rand({32, 32, 3, 3}, gen);
  const Tensor gy = rand({8, 32, 16, 16}, gen);
  std::vector<float> first_dw, first_dx;
  for (int run = 0; run < 3; ++run) {
    Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
    conv2d(x, w, Tensor(), {1, 1}, {1, 1}).backward(gy);
    if (run == 0) {
      first_dw = w.grad().to_vector<float>();
      first_dx = x.grad().to_vector<float>();
    } else {
      EXPECT_EQ(w.grad().to_vector<float>(), first_dw) << "run " << run;
      EXPECT_EQ(x.grad().to_vector<float>(), first_dx) << "run " << run;
    }
  }
}

TEST(Conv2d, GradientsOnlyForInputsThatNeedThem) {
  Generator gen(7);
  const Tensor x = rand({2, 3, 5, 5}, gen);
  Tensor w = rand({4, 3, 3, 3}, gen).set_requires_grad(true);
  conv2d(x, w).backward(ones({2, 4, 3, 3}));
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());
}

TEST(Conv2d, ShapeErrors) {
  const Tensor x = zeros({2, 3, 5, 5});
  expect_error([&] { conv2d(x, zeros({4, 2, 3, 3})); }, "channels");
  expect_error([&] { conv2d(x, zeros({4, 3, 7, 3})); }, "larger than the padded input");
  expect_error(
      [&] {
        conv2d(x, zeros({4, 3, 4, 4}), Tensor(), {1, 1}, {0, 0}, {2, 2});
      },
      "larger than the padded input");
  expect_error([&] { conv2d(zeros({3, 5, 5}), zeros({4, 3, 3, 3})); }, "4-d");
  expect_error([&] { conv2d(x, zeros({4, 3, 3})); }, "4-d");
  expect_error([&] { conv2d(x, zeros({4, 3, 3, 3}), zeros({3})); }, "bias");
  expect_error([&] { conv2d(x, zeros({4, 3, 3, 3}), Tensor(), {0, 1}); }, "stride");
  expect_error([&] { conv2d(x, zeros({4, 3, 3, 3}), Tensor(), {1, 1}, {-1, 0}); }, "padding");
  expect_error([&] { conv2d(x, zeros({4, 3, 3, 3}, DType::f64)); }, "dtype");
}

// ---- pooling by hand ----

// x = 0..15 in a 4x4 plane.
Tensor ramp4x4(DType dtype = DType::f32) { return arange(0, 16, 1, dtype).view({1, 1, 4, 4}); }

TEST(Pool, MaxPoolByHand) {
  EXPECT_EQ(max_pool2d(ramp4x4(), {2, 2}).to_vector<float>(), (std::vector<float>{5, 7, 13, 15}));
  // Negated ramp, kernel 3, stride 2, padding 1: windows rows/cols {-1..1} and {1..3}; the -inf
  // padding never wins, so the top-left output is x[0][0] = 0.
  const Tensor neg = from_vector<float>(
      {0, -1, -2, -3, -4, -5, -6, -7, -8, -9, -10, -11, -12, -13, -14, -15}, {1, 1, 4, 4});
  EXPECT_EQ(max_pool2d(neg, {3, 3}, {2, 2}, {1, 1}).to_vector<float>(),
            (std::vector<float>{0, -1, -4, -5}));
  // Floor mode: a 5-wide input with kernel 2 gives 2 columns, the last column is dropped.
  EXPECT_EQ(max_pool2d(arange(0, 10, 1, DType::f32).view({1, 1, 2, 5}), {2, 2}).shape(),
            (Shape{1, 1, 1, 2}));
}

TEST(Pool, MaxPoolBackwardRoutesToTheMaximum) {
  // The centre is the maximum of all four overlapping 2x2 windows: it collects all four.
  Tensor x = from_vector<double>({1, 2, 3, 4, 9, 5, 6, 7, 8}, {1, 1, 3, 3}).set_requires_grad(true);
  Tensor y = max_pool2d(x, {2, 2}, {1, 1});
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{9, 9, 9, 9}));
  y.backward(from_vector<double>({1, 2, 3, 4}, {1, 1, 2, 2}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 0, 0, 10, 0, 0, 0, 0}));
}

TEST(Pool, AvgPoolByHand) {
  EXPECT_EQ(avg_pool2d(ramp4x4(), {2, 2}).to_vector<float>(),
            (std::vector<float>{2.5f, 4.5f, 10.5f, 12.5f}));
  // Kernel 3, stride 2, padding 1: windows cover rows/cols {-1..1} and {1..3}. Their inputs:
  // {0,1,4,5} = 10 (5 of 9 padded), {1,2,3,5,6,7} = 24 and {4,5,8,9,12,13} = 51 (3 padded),
  // and the full window around 10 = 90. count_include_pad divides by 9 throughout.
  const auto incl = avg_pool2d(ramp4x4(DType::f64), {3, 3}, {2, 2}, {1, 1}).to_vector<double>();
  expect_near_all(incl, {10.0 / 9, 24.0 / 9, 51.0 / 9, 90.0 / 9}, 1e-12, "count_include_pad");
  const auto excl =
      avg_pool2d(ramp4x4(DType::f64), {3, 3}, {2, 2}, {1, 1}, false).to_vector<double>();
  expect_near_all(excl, {10.0 / 4, 24.0 / 6, 51.0 / 6, 90.0 / 9}, 1e-12, "exclude pad");
}

TEST(Pool, AvgPoolBackwardSharesEvenly) {
  Tensor x = ramp4x4(DType::f64).clone().set_requires_grad(true);
  avg_pool2d(x, {2, 2}).backward(from_vector<double>({4, 8, 12, 16}, {1, 1, 2, 2}));
  EXPECT_EQ(x.grad().to_vector<double>(),
            (std::vector<double>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
}

TEST(Pool, AdaptiveAvgPoolIsThePlaneMean) {
  const Tensor x = arange(0, 12, 1, DType::f32).view({1, 2, 2, 3});
  const Tensor y = adaptive_avg_pool2d(x, {1, 1});
  EXPECT_EQ(y.shape(), (Shape{1, 2, 1, 1}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{2.5f, 8.5f}));
  expect_error([&] { adaptive_avg_pool2d(x, {2, 2}); }, "not implemented");
}

TEST(Pool, ShapeErrors) {
  const Tensor x = zeros({1, 1, 4, 4});
  expect_error([&] { max_pool2d(x, {2, 2}, {2, 2}, {2, 2}); }, "half the kernel");
  expect_error([&] { avg_pool2d(x, {3, 3}, {1, 1}, {2, 0}); }, "half the kernel");
  expect_error([&] { max_pool2d(x, {5, 5}); }, "larger than the padded input");
  expect_error([&] { max_pool2d(zeros({4, 4}), {2, 2}); }, "4-d");
  expect_error([&] { avg_pool2d(x, {0, 2}); }, "kernel");
}

// ---- batch_norm by hand ----

// One channel holding {1, 2, 3, 6}: mean 3, biased variance 14/4 = 3.5, unbiased 14/3.
TEST(BatchNorm, TrainingByHandMomentumAndUnbiasedVar) {
  const Tensor x = from_vector<double>({1, 2, 3, 6}, {4, 1});
  Tensor rm = zeros({1}, DType::f64), rv = ones({1}, DType::f64);
  const uint64_t version = rm.storage()->version();
  const Tensor w = from_vector<double>({2}, {1}), b = from_vector<double>({0.5}, {1});
  const Tensor y = batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5);
  const double is = 1 / std::sqrt(3.5 + 1e-5);
  expect_near_all(y.to_vector<double>(),
                  {-2 * 2 * is + 0.5, -1 * 2 * is + 0.5, 0.5, 3 * 2 * is + 0.5}, 1e-12, "y");
  EXPECT_NEAR(rm.item(), 0.9 * 0 + 0.1 * 3, 1e-12);
  EXPECT_NEAR(rv.item(), 0.9 * 1 + 0.1 * 14.0 / 3.0, 1e-12);
  EXPECT_GT(rm.storage()->version(), version);
  // A second step moves the running statistics again from their new values.
  batch_norm(x, rm, rv, w, b, true, 0.5, 1e-5);
  EXPECT_NEAR(rm.item(), 0.5 * 0.3 + 0.5 * 3, 1e-12);
  EXPECT_NEAR(rv.item(), 0.5 * (0.9 + 0.1 * 14.0 / 3.0) + 0.5 * 14.0 / 3.0, 1e-12);
}

// [N=2, C=2, H=1, W=2]: channel 0 holds {0, 2, 4, 6} (mean 3, var 5, unbiased 20/3),
// channel 1 holds {1, 1, 1, 5} (mean 2, var 3, unbiased 4).
TEST(BatchNorm, FourDimensionalPerChannel) {
  const Tensor x = from_vector<float>({0, 2, 1, 1, 4, 6, 1, 5}, {2, 2, 1, 2});
  Tensor rm = zeros({2}), rv = ones({2});
  const Tensor y = batch_norm(x, rm, rv, Tensor(), Tensor(), true, 0.1, 0.0);
  const double s0 = 1 / std::sqrt(5.0), s1 = 1 / std::sqrt(3.0);
  expect_near_all(y.to_vector<double>(),
                  {-3 * s0, -1 * s0, -1 * s1, -1 * s1, 1 * s0, 3 * s0, -1 * s1, 3 * s1}, 1e-6, "y");
  expect_near_all(rm.to_vector<double>(), {0.3, 0.2}, 1e-6, "running_mean");
  expect_near_all(rv.to_vector<double>(), {0.9 + 0.1 * 20.0 / 3.0, 0.9 + 0.1 * 4.0}, 1e-6,
                  "running_var");
}

TEST(BatchNorm, EvalUsesRunningStatsAndLeavesThemAlone) {
  const Tensor x = from_vector<double>({1, 2, 3, 6}, {4, 1});
  Tensor rm = from_vector<double>({1}, {1}), rv = from_vector<double>({4}, {1});
  const Tensor y = batch_norm(x, rm, rv, Tensor(), from_vector<double>({1}, {1}), false, 0.1, 0.0);
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{1, 1.5, 2, 3.5}));
  EXPECT_EQ(rm.item(), 1.0);
  EXPECT_EQ(rv.item(), 4.0);
}

TEST(BatchNorm, TrainingBackwardSumsToZero) {
  // With batch statistics, shifting all inputs of a channel changes nothing: dx sums to 0.
  Generator gen(3);
  Tensor x = rand({4, 3, 2, 2}, gen, DType::f64).set_requires_grad(true);
  batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true)
      .backward(rand({4, 3, 2, 2}, gen, DType::f64));
  const auto g = x.grad().to_vector<double>();
  for (int64_t ch = 0; ch < 3; ++ch) {
    double total = 0;
    for (int64_t s = 0; s < 4; ++s) {
      for (int64_t i = 0; i < 4; ++i) total += g[size_t((s * 3 + ch) * 4 + i)];
    }
    EXPECT_NEAR(total, 0.0, 1e-12) << "channel " << ch;
  }
}

TEST(BatchNorm, BadShapesAndModes) {
  const Tensor x = zeros({4, 3, 2, 2});
  expect_error([&] { batch_norm(x, zeros({2}), ones({2}), Tensor(), Tensor(), true); },
               "running_mean");
  expect_error([&] { batch_norm(x, Tensor(), Tensor(), ones({4}), Tensor(), true); }, "weight");
  expect_error([&] { batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false); },
               "evaluation mode");
  expect_error(
      [&] {
        batch_norm(zeros({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      "more than 1 value per channel");
  expect_error(
      [&] {
        batch_norm(zeros({4, 3, 2}), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      "[N, C] or");
  Tensor needs_grad = zeros({3}).set_requires_grad(true);
  expect_error([&] { batch_norm(x, needs_grad, ones({3}), Tensor(), Tensor(), true); },
               "must not require grad");
}

}  // namespace
}  // namespace rg
