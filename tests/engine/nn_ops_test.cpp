// Forward values of the neural-network ops against hand-computed numbers, their errors, dropout's
// statistics and reproducibility, and the argmax/top-k metrics.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numbers>
#include <string>

#include "engine/ops/activation.h"
#include "engine/ops/binary.h"
#include "engine/ops/dropout.h"
#include "engine/ops/embedding.h"
#include "engine/ops/factory.h"
#include "engine/ops/flatten.h"
#include "engine/ops/loss.h"
#include "engine/ops/matmul.h"
#include "engine/ops/metrics.h"
#include "engine/ops/reduce.h"
#include "engine/ops/shape.h"
#include "engine/ops/unary.h"
#include "kernels/cpu/parallel.h"
#include "kernels/error.h"
#include "support/errors.h"

namespace rg {
namespace {

const double kLn2 = std::log(2.0), kLn3 = std::log(3.0);

Tensor f32(const std::vector<float>& v, const Shape& shape) { return from_vector<float>(v, shape); }
Tensor i64(const std::vector<int64_t>& v) { return from_vector<int64_t>(v, {int64_t(v.size())}); }

void expect_near(const Tensor& t, const std::vector<double>& expected, double tol = 1e-6) {
  const std::vector<double> got = t.to_vector<double>();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], tol) << "element " << i;
}

using testing::expect_error;

// d sum(f(x)) / dx for a f32 input.
Tensor grad_of_sum(const std::function<Tensor(const Tensor&)>& f, Tensor x) {
  x.set_requires_grad(true);
  sum(f(x)).backward();
  return x.grad();
}

TEST(Activation, ReluAndLeakyRelu) {
  expect_near(relu(f32({-1.5f, 0.f, 2.f}, {3})), {0, 0, 2});
  EXPECT_TRUE(std::isnan(relu(f32({NAN}, {1})).item()));  // NaN propagates, as in PyTorch
  expect_near(grad_of_sum([](const Tensor& x) { return relu(x); }, f32({-1, 2}, {2})), {0, 1});
  // -2 * 0.1 = -0.2; positives pass through; default slope 0.01: -2 -> -0.02.
  expect_near(leaky_relu(f32({-2, 3}, {2}), 0.1), {-0.2, 3});
  expect_near(leaky_relu(f32({-2}, {1})), {-0.02});
  // 8 elements so that Eigen's packet path sees the NaN, not only its scalar tail.
  EXPECT_TRUE(std::isnan(leaky_relu(f32({1, NAN, -1, 2, 3, 4, 5, 6}, {8})).to_vector<float>()[1]));
  EXPECT_TRUE(std::isnan(relu(f32({1, NAN, -1, 2, 3, 4, 5, 6}, {8})).to_vector<float>()[1]));
  expect_near(grad_of_sum([](const Tensor& x) { return leaky_relu(x, 0.1); }, f32({-2, 3}, {2})),
              {0.1, 1});
}

TEST(Activation, GeluBothForms) {
  // Exact: x Phi(x); Phi(1) = 0.8413447, Phi(-1) = 0.1586553 (normal table).
  expect_near(gelu(f32({1, -1, 0}, {3})), {0.8413447, -0.1586553, 0});
  // tanh form at 1: sqrt(2/pi) * 1.044715 = 0.8335615, tanh of it = 0.6823840,
  // 0.5 * 1.6823840 = 0.8411920.
  expect_near(gelu(f32({1, 0}, {2}), true), {0.8411920, 0});
  // d/dx x Phi(x) = Phi(x) + x phi(x): at 0 -> 0.5, at 1 -> 0.8413447 + 0.2419707 = 1.0833154.
  expect_near(grad_of_sum([](const Tensor& x) { return gelu(x); }, f32({0, 1}, {2})),
              {0.5, 1.0833154});
}

TEST(Activation, GeluTanhFormAgainstTheFormulaInDouble) {
  // minGPT's NewGELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and its derivative
  // 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
  const std::vector<double> xs = {-3.0, -1.5, -0.25, 0.0, 0.5, 1.0, 2.0, 4.0};
  const double c = std::sqrt(2.0 / std::numbers::pi), k = 0.044715;
  std::vector<double> y, dy;
  for (double x : xs) {
    const double t = std::tanh(c * (x + k * x * x * x));
    y.push_back(0.5 * x * (1 + t));
    dy.push_back(0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * k * x * x));
  }
  const Tensor x64 = from_vector<double>(xs, {int64_t(xs.size())});
  const Tensor x32 = x64.to(DType::f32);
  expect_near(gelu(x64, true), y, 1e-14);
  expect_near(grad_of_sum([](const Tensor& x) { return gelu(x, true); }, x64), dy, 1e-14);
  expect_near(gelu(x32, true), y, 1e-6);
  expect_near(grad_of_sum([](const Tensor& x) { return gelu(x, true); }, x32), dy, 1e-6);
}

TEST(Embedding, ForwardPicksRowsOfAnyIndexShape) {
  const Tensor w = f32({0, 1, 10, 11, 20, 21}, {3, 2});
  const Tensor out = embedding(w, from_vector<int64_t>({2, 0, 2, 1}, {2, 2}));
  EXPECT_EQ(out.shape(), (Shape{2, 2, 2}));
  expect_near(out, {20, 21, 0, 1, 20, 21, 10, 11});
  const Tensor one = embedding(w, from_vector<int64_t>({1}, {}));  // a 0-d index: one row
  EXPECT_EQ(one.shape(), (Shape{2}));
  expect_near(one, {10, 11});
  EXPECT_EQ(embedding(w, from_vector<int64_t>({}, {0, 4})).shape(), (Shape{0, 4, 2}));
}

TEST(Embedding, BackwardSumsDuplicatesAndSkipsThePaddingRow) {
  Tensor w = zeros({4, 2});
  w.set_requires_grad(true);
  // Rows 1 (three times), 3 (twice, the padding row) and 0; row 2 is never picked.
  const Tensor idx = from_vector<int64_t>({1, 3, 1, 0, 3, 1}, {6});
  const Tensor up = f32({1, 2, 10, 20, 100, 200, 1000, 2000, 5, 6, 7, 8}, {6, 2});
  sum(mul(embedding(w, idx, 3), up)).backward();
  expect_near(w.grad(), {1000, 2000, 108, 210, 0, 0, 0, 0});
  // Without a padding index row 3 gets its two rows.
  Tensor w2 = zeros({4, 2});
  w2.set_requires_grad(true);
  sum(mul(embedding(w2, idx), up)).backward();
  expect_near(w2.grad(), {1000, 2000, 108, 210, 0, 0, 15, 26});
}

TEST(Embedding, Errors) {
  const Tensor w = zeros({3, 2});
  expect_error([&] { embedding(w, from_vector<int64_t>({0, 3}, {2})); },
               "embedding: index 3 at position 1 is out of range for 3 embeddings");
  expect_error([&] { embedding(w, from_vector<int64_t>({-2}, {1})); },
               "embedding: index -2 at position 0 is out of range for 3 embeddings");
  expect_error([&] { embedding(w, f32({0}, {1})); }, "indices must be an i64 tensor");
  expect_error([&] { embedding(zeros({3}), i64({0})); }, "expected a 2-d tensor");
  expect_error([&] { embedding(w, i64({0}), 3); }, "padding_idx 3 is out of range");
}

TEST(Shape, SplitLastDimIntoChunksWithASmallerLast) {
  std::vector<double> v(60);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  const Tensor x = from_vector<double>(v, {2, 5, 6});
  const std::vector<Tensor> chunks = split(x, 4, -1);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].shape(), (Shape{2, 5, 4}));
  EXPECT_EQ(chunks[1].shape(), (Shape{2, 5, 2}));
  std::vector<double> first, second;
  for (int64_t r = 0; r < 10; ++r) {
    for (int64_t c = 0; c < 6; ++c) (c < 4 ? first : second).push_back(v[r * 6 + c]);
  }
  EXPECT_EQ(chunks[0].to_vector<double>(), first);
  EXPECT_EQ(chunks[1].to_vector<double>(), second);
  EXPECT_EQ(split(zeros({0, 3}), 2, 0).size(), 1u);  // an empty dim: one empty chunk
  EXPECT_EQ(split(zeros({4, 3}), 2, 0).size(), 2u);
}

TEST(Shape, TransposeMiddleDimsOfBthdMatchesHandIndexing) {
  const int64_t B = 2, T = 3, H = 4, D = 5;
  std::vector<float> v(B * T * H * D);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const Tensor y = transpose(f32(v, {B, T, H, D}), 1, 2);
  EXPECT_EQ(y.shape(), (Shape{B, H, T, D}));
  const std::vector<float> got = y.to_vector<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d)
          ASSERT_EQ(got[((b * H + h) * T + t) * D + d], v[((b * T + t) * H + h) * D + d])
              << b << " " << h << " " << t << " " << d;
  EXPECT_EQ(transpose(f32(v, {B, T, H, D}), -1, 0).shape(), (Shape{D, T, H, B}));
  // i64 copies too (not differentiable).
  EXPECT_EQ(permute(from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3}), {1, 0}).to_vector<int64_t>(),
            (std::vector<int64_t>{1, 4, 2, 5, 3, 6}));
}

TEST(Shape, SplitBackwardOnlyFromTheChunksUsed) {
  Tensor x = zeros({2, 5});
  x.set_requires_grad(true);
  const std::vector<Tensor> c = split(x, 2, 1);  // columns 0-1, 2-3, 4
  ASSERT_EQ(c.size(), 3u);
  add(sum(mul(c[0], f32({1, 2, 3, 4}, {2, 2}))), sum(mul(c[2], f32({10, 20}, {2, 1})))).backward();
  expect_near(x.grad(), {1, 2, 0, 0, 10, 3, 4, 0, 0, 20});
}

TEST(Shape, PermuteBackwardIsTheInversePermutation) {
  Tensor x = zeros({2, 3, 4});
  x.set_requires_grad(true);
  std::vector<float> up(24);
  for (size_t i = 0; i < up.size(); ++i) up[i] = static_cast<float>(i);
  sum(mul(permute(x, {2, 0, 1}), f32(up, {4, 2, 3}))).backward();
  const std::vector<double> g = x.grad().to_vector<double>();
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(g[(a * 3 + b) * 4 + c], up[(c * 2 + a) * 3 + b]);
}

TEST(Shape, Errors) {
  const Tensor x = zeros({2, 3});
  expect_error([&] { transpose(x, 0, 2); }, "transpose: dim1 2 is out of range for shape [2, 3]");
  expect_error([&] { split(x, 0, 1); }, "split: split_size must be positive, got 0");
  expect_error([&] { split(x, 1, -3); }, "split: dim -3 is out of range for shape [2, 3]");
  expect_error(
      [&] {
        permute(x, {1, 1});
      },
      "permute: dims [1, 1] is not a permutation of the 2 dimensions of shape [2, 3]");
}

TEST(Activation, SigmoidAndTanh) {
  // sigmoid(ln 3) = 1 / (1 + 1/3) = 0.75; saturates without NaN at +-100.
  expect_near(sigmoid(f32({0, float(kLn3), float(-kLn3), -100, 100}, {5})),
              {0.5, 0.75, 0.25, 0, 1});
  // sigmoid' = s (1 - s) = 0.75 * 0.25 = 0.1875
  expect_near(grad_of_sum([](const Tensor& x) { return sigmoid(x); }, f32({float(kLn3)}, {1})),
              {0.1875});
  // tanh(ln 2) = (2 - 1/2) / (2 + 1/2) = 0.6; tanh' = 1 - 0.36 = 0.64.
  expect_near(tanh(f32({float(kLn2), 0}, {2})), {0.6, 0});
  expect_near(grad_of_sum([](const Tensor& x) { return tanh(x); }, f32({float(kLn2)}, {1})),
              {0.64});
  EXPECT_EQ(tanh(from_vector<double>({kLn2}, {1})).dtype(), DType::f64);
}

TEST(Matmul, TwoDimensionalAndBackward) {
  Tensor a = f32({1, 2, 3, 4}, {2, 2});
  Tensor b = f32({5, 6, 7, 8}, {2, 2});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor c = matmul(a, b);
  // [1*5 + 2*7, 1*6 + 2*8; 3*5 + 4*7, 3*6 + 4*8]
  expect_near(c, {19, 22, 43, 50});
  sum(c).backward();
  // dA = 1 B^T: each row holds B's row sums (11, 15); dB = A^T 1: A's column sums (4, 6).
  expect_near(a.grad(), {11, 15, 11, 15});
  expect_near(b.grad(), {4, 4, 6, 6});
}

TEST(Matmul, VectorsAndBatches) {
  // [1, 2] . [3, 4] = 11
  Tensor dot = matmul(f32({1, 2}, {2}), f32({3, 4}, {2}));
  EXPECT_EQ(dot.dim(), 0);
  EXPECT_EQ(dot.item(), 11.0);
  // [1, 2] x [[1, 2, 3], [4, 5, 6]] = [9, 12, 15]
  expect_near(matmul(f32({1, 2}, {2}), f32({1, 2, 3, 4, 5, 6}, {2, 3})), {9, 12, 15});
  // [[1, 2, 3], [4, 5, 6]] x [1, 0, -1] = [-2, -2]
  expect_near(matmul(f32({1, 2, 3, 4, 5, 6}, {2, 3}), f32({1, 0, -1}, {3})), {-2, -2});
  // Batch 0: [1, 2] x [1, 1]^T = 3; batch 1: [3, 4] x [2, 0]^T = 6.
  Tensor bat = matmul(f32({1, 2, 3, 4}, {2, 1, 2}), f32({1, 1, 2, 0}, {2, 2, 1}));
  EXPECT_EQ(bat.shape(), (Shape{2, 1, 1}));
  expect_near(bat, {3, 6});
  // Shared right operand: [[1, 2]] and [[3, 4]] times [1, 1]^T.
  expect_near(matmul(f32({1, 2, 3, 4}, {2, 1, 2}), f32({1, 1}, {2, 1})), {3, 7});
  // Shared left operand [1, 2] times per-batch [1, 1]^T and [2, 0]^T.
  expect_near(matmul(f32({1, 2}, {1, 2}), f32({1, 1, 2, 0}, {2, 2, 1})), {3, 2});
}

TEST(Matmul, ShapeErrors) {
  expect_error([] { matmul(zeros({2, 3}), zeros({4, 5})); }, "(3 != 4)");
  expect_error([] { matmul(zeros({2, 2, 3}), zeros({3, 3, 1})); }, "batch sizes differ");
  expect_error([] { matmul(zeros({1, 2, 2, 3}), zeros({3, 1})); }, "1-d, 2-d or 3-d");
}

TEST(Linear, ForwardBackwardWithAndWithoutBias) {
  Tensor x = f32({1, 2, 3, 0, 1, 0}, {2, 3});
  Tensor w = f32({1, 0, -1, 2, 1, 0}, {2, 3});
  Tensor b = f32({10, 20}, {2});
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor y = linear(x, w, b);
  // Row 0: [1 - 3 + 10, 2 + 2 + 20]; row 1: [0 + 10, 1 + 20].
  expect_near(y, {8, 24, 10, 21});
  sum(y).backward();
  // dX = 1 W: every row is W's column sums [3, 1, -1]; dW = 1^T X: every row is X's column sums;
  // db counts the rows.
  expect_near(x.grad(), {3, 1, -1, 3, 1, -1});
  expect_near(w.grad(), {1, 3, 3, 1, 3, 3});
  expect_near(b.grad(), {2, 2});
  expect_near(linear(x.detach(), w.detach()), {-2, 4, 0, 1});
  // Leading dimensions are rows of the GEMM; a 1-d input is a single row.
  EXPECT_EQ(linear(zeros({4, 5, 3}), w.detach()).shape(), (Shape{4, 5, 2}));
  expect_near(linear(f32({1, 2, 3}, {3}), w.detach(), b.detach()), {8, 24});
}

TEST(Linear, ShapeErrors) {
  expect_error([] { linear(zeros({2, 3}), zeros({4, 5})); }, "has 3 features but weight [4, 5]");
  expect_error([] { linear(zeros({2, 3}), zeros({4, 3}), zeros({3})); }, "bias shape [3]");
  expect_error([] { linear(zeros({2, 3}), zeros({3})); }, "linear: expected a 2-d tensor");
  expect_error([] { linear(zeros({2, 3}), zeros({4, 3}, DType::f64)); }, "dtype mismatch");
}

TEST(Flatten, ShapesAndSharedStorage) {
  Tensor x = arange(24, DType::f32).view({2, 3, 4});
  EXPECT_EQ(flatten(x).shape(), (Shape{2, 12}));
  EXPECT_EQ(flatten(x, 0).shape(), (Shape{24}));
  EXPECT_EQ(flatten(x, 0, 1).shape(), (Shape{6, 4}));
  EXPECT_EQ(flatten(x, -2, -1).shape(), (Shape{2, 12}));
  EXPECT_EQ(flatten(x, 1, 1).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(flatten(full({}, 2.0), 0).shape(), (Shape{1}));
  expect_error([] { flatten(full({}, 2.0)); }, "start_dim 1 is out of range for shape []");
  EXPECT_EQ(flatten(x).storage().get(), x.storage().get());
  expect_error([&] { flatten(x, 2, 1); }, "comes after end_dim");
  expect_error([&] { flatten(x, 3); }, "start_dim 3 is out of range");
}

TEST(Dropout, IdentityZerosAndBadP) {
  Generator gen(5);
  Tensor x = ones({10});
  EXPECT_TRUE(dropout(x, 0.5, false, gen).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0, true, gen).is_same(x));
  EXPECT_EQ(gen.offset(), 0u);
  EXPECT_EQ(dropout(x, 1.0, true, gen).to_vector<float>(), std::vector<float>(10, 0.f));
  expect_error([&] { dropout(x, -0.1, true, gen); }, "p must be in [0, 1], got -0.1");
  expect_error([&] { dropout(x, 1.5, false, gen); }, "got 1.5");
  expect_error([&] { dropout(x, std::numeric_limits<double>::quiet_NaN(), true, gen); },
               "p must be in [0, 1]");
}

TEST(Dropout, KeepsAboutOneMinusPScaled) {
  const int64_t n = 200000;
  const double p = 0.3;
  Generator gen(11);
  const std::vector<float> out = dropout(ones({n}), p, true, gen).to_vector<float>();
  EXPECT_EQ(gen.offset(), uint64_t(n / 4));
  const float scale = float(1.0 / (1.0 - p));
  int64_t kept = 0;
  for (float v : out) {
    ASSERT_TRUE(v == 0.f || v == scale) << v;
    kept += v != 0.f;
  }
  // Binomial: the standard deviation of the kept fraction is sqrt(0.3 * 0.7 / n) = 0.001.
  EXPECT_NEAR(double(kept) / double(n), 1.0 - p, 0.005);
}

TEST(Dropout, MaskComesFromTheSeedNotTheThreads) {
  const int saved_threads = kernels::cpu::num_threads();
  const int64_t n = (1 << 17) + 3;  // several parallel chunks and a partial last counter
  Tensor x = arange(0, double(n), 1, DType::f32);
  auto run = [&](int threads, uint64_t seed) {
    kernels::cpu::set_num_threads(threads);
    Generator gen(seed);
    return dropout(x, 0.5, true, gen).to_vector<float>();
  };
  const auto one = run(1, 7), two = run(2, 7), other_seed = run(2, 8);
  kernels::cpu::set_num_threads(saved_threads);
  EXPECT_EQ(one, two);
  EXPECT_NE(one, other_seed);
  // A second call on the same generator continues the stream: a different mask.
  Generator gen(7);
  const auto first = dropout(x, 0.5, true, gen).to_vector<float>();
  const auto second = dropout(x, 0.5, true, gen).to_vector<float>();
  EXPECT_EQ(first, one);
  EXPECT_NE(first, second);
}

TEST(Dropout, GradientIsTheMask) {
  Generator gen(3);
  Tensor x = ones({1000});
  x.set_requires_grad(true);
  Tensor y = dropout(x, 0.25, true, gen);
  sum(y).backward();
  // With x = 1 the output is the mask itself, and so is the gradient.
  EXPECT_EQ(x.grad().to_vector<float>(), y.to_vector<float>());
}

TEST(LogSoftmax, HandValuesAnyDim) {
  // softmax([0, ln 3]) = [1/4, 3/4]: log = [-1.3862944, -0.2876821], for any shift.
  expect_near(log_softmax(f32({0, float(kLn3)}, {1, 2}), 1), {-1.3862944, -0.2876821});
  expect_near(log_softmax(f32({50, 50 + float(kLn3)}, {1, 2}), -1), {-1.3862944, -0.2876821}, 1e-5);
  expect_near(log_softmax(f32({0, float(kLn3)}, {2, 1}), 0), {-1.3862944, -0.2876821});
  // Huge logits stay finite: [1000, 0] -> [0, -1000].
  expect_near(log_softmax(f32({1000, 0}, {2}), 0), {0, -1000});
  // Middle dim of [2, 2, 2]: pairs (x[o, 0, i], x[o, 1, i]) are (0, ln 3) or (ln 3, 0).
  const float l3 = float(kLn3);
  expect_near(log_softmax(f32({0, l3, l3, 0, l3, 0, 0, l3}, {2, 2, 2}), 1),
              {-1.3862944, -0.2876821, -0.2876821, -1.3862944, -0.2876821, -1.3862944, -1.3862944,
               -0.2876821});
  expect_error([] { log_softmax(zeros({2, 3}), 2); }, "dim 2 is out of range");
}

// [r, c] -> [c, r], element by element.
Tensor transposed(const Tensor& x) {
  const int64_t r = x.size(0), c = x.size(1);
  const std::vector<double> v = x.to_vector<double>();
  std::vector<double> t(v.size());
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < c; ++j) t[size_t(j * r + i)] = v[size_t(i * c + j)];
  }
  return from_vector<double>(t, {c, r});
}

TEST(LogSoftmax, StridedDimAgreesWithRowPath) {
  // dim 0 of [3, 2500] runs the strided path over several inner chunks; the same numbers laid out
  // as rows of [2500, 3] run the row path. Forward and backward must agree.
  Generator gen(23);
  Tensor x = randn({3, 2500}, gen, DType::f64);
  Tensor w = rand({3, 2500}, gen, DType::f64);
  Tensor xt = transposed(x);
  x.set_requires_grad(true);
  xt.set_requires_grad(true);
  Tensor y = log_softmax(x, 0);
  Tensor yt = log_softmax(xt, 1);
  const std::vector<double> a = transposed(y.detach()).to_vector<double>();
  const std::vector<double> b = yt.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-12) << i;
  sum(mul(y, w)).backward();
  sum(mul(yt, transposed(w))).backward();
  const std::vector<double> ga = transposed(x.grad()).to_vector<double>();
  const std::vector<double> gb = xt.grad().to_vector<double>();
  for (size_t i = 0; i < ga.size(); ++i) ASSERT_NEAR(ga[i], gb[i], 1e-12) << i;
}

TEST(NllLoss, HandValuesAndGradient) {
  Tensor logp = f32({-1, -2, -3, -4}, {2, 2});
  logp.set_requires_grad(true);
  Tensor loss = nll_loss(logp, i64({1, 0}));
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_NEAR(loss.item(), (2.0 + 3.0) / 2, 1e-6);
  loss.backward();
  expect_near(logp.grad(), {0, -0.5, -0.5, 0});
}

TEST(NllLoss, BadTargets) {
  Tensor logp = zeros({3, 4});
  expect_error(
      [&] {
        nll_loss(logp, i64({0, 4, 1}));
      },
      "target 4 at index 1 is out of range for 4 classes");
  expect_error([&] { nll_loss(logp, i64({0, 1, -1})); }, "target -1 at index 2");
  expect_error([&] { nll_loss(logp, zeros({3})); }, "target must be an i64 tensor");
  expect_error([&] { nll_loss(logp, i64({0, 1})); }, "target shape [2] does not match");
  expect_error([&] { nll_loss(zeros({3}), i64({0, 1, 2})); }, "nll_loss: expected a 2-d tensor");
}

TEST(CrossEntropy, HandValuesWithAndWithoutSmoothing) {
  Tensor logits = f32({0, float(kLn3)}, {1, 2});
  logits.set_requires_grad(true);
  // -log(3/4) = 0.2876821
  Tensor plain = cross_entropy(logits, i64({1}));
  EXPECT_NEAR(plain.item(), 0.2876821, 1e-6);
  plain.backward();
  // softmax - onehot = [1/4, 3/4 - 1]
  expect_near(logits.grad(), {0.25, -0.25});
  logits.zero_grad();
  // eps = 0.2: 0.8 * 0.2876821 + 0.2 * (1.3862944 + 0.2876821) / 2 = 0.3975433
  Tensor smooth = cross_entropy(logits, i64({1}), 0.2);
  EXPECT_NEAR(smooth.item(), 0.3975433, 1e-6);
  smooth.backward();
  // Smoothed target: 0.8 * onehot + 0.2 / 2 = [0.1, 0.9]; softmax minus it = [0.15, -0.15].
  expect_near(logits.grad(), {0.15, -0.15});
  // Stable for huge logits: loss = lse - x[target] = 1000 - 0.
  EXPECT_NEAR(cross_entropy(f32({1000, 0}, {1, 2}), i64({1})).item(), 1000.0, 1e-3);
  EXPECT_NEAR(cross_entropy(f32({1000, 0}, {1, 2}), i64({0})).item(), 0.0, 1e-6);
}

TEST(CrossEntropy, MatchesComposedFormula) {
  Generator gen(17);
  Tensor logits = randn({7, 5}, gen, DType::f64);
  Tensor target = i64({0, 4, 2, 2, 1, 3, 0});
  const Tensor logp = log_softmax(logits, 1);
  EXPECT_NEAR(cross_entropy(logits, target).item(), nll_loss(logp, target).item(), 1e-12);
  // PyTorch: (1 - eps) * nll + eps * mean over rows and classes of -log_softmax.
  const double eps = 0.3;
  const double composed = (1 - eps) * nll_loss(logp, target).item() + eps * mean(neg(logp)).item();
  EXPECT_NEAR(cross_entropy(logits, target, eps).item(), composed, 1e-12);
}

TEST(CrossEntropy, Errors) {
  expect_error(
      [] {
        cross_entropy(zeros({2, 3}), i64({0, 3}));
      },
      "cross_entropy: target 3 at index 1 is out of range for 3 classes");
  expect_error(
      [] {
        cross_entropy(zeros({2, 3}), i64({0, 1}), 1.5);
      },
      "label_smoothing must be in [0, 1], got 1.5");
}

TEST(SmoothL1Loss, HandValuesBothSidesOfBetaAndL1) {
  // d = 0, 0.5, -2, 3 with beta 1: 0, 0.5 * 0.25, 2 - 0.5, 3 - 0.5 -> mean 4.125 / 4.
  const auto loss_and_grad = [](double beta) {
    Tensor x = f32({0, 0.5f, -2, 3}, {4});
    x.set_requires_grad(true);
    Tensor loss = smooth_l1_loss(x, zeros({4}), beta);
    loss.backward();
    return std::pair{loss.item(), x.grad()};
  };
  auto [l1, g1] = loss_and_grad(1.0);
  EXPECT_NEAR(l1, 4.125 / 4, 1e-7);
  expect_near(g1, {0, 0.5 / 4, -1.0 / 4, 1.0 / 4});  // d / beta inside, sign(d) outside, / n
  // beta 2: 0, 0.5 * 0.25 / 2, 2 - 1 (|d| == beta counts as outside; both forms give 1), 3 - 1.
  auto [l2, g2] = loss_and_grad(2.0);
  EXPECT_NEAR(l2, (0.0625 + 1.0 + 2.0) / 4, 1e-7);
  expect_near(g2, {0, 0.25 / 4, -1.0 / 4, 1.0 / 4});
  // beta 0 is the L1 loss; its gradient at d == 0 is 0.
  auto [l0, g0] = loss_and_grad(0.0);
  EXPECT_NEAR(l0, 5.5 / 4, 1e-7);
  expect_near(g0, {0, 0.25, -0.25, 0.25});
  EXPECT_TRUE(std::isnan(smooth_l1_loss(zeros({0}), zeros({0})).item()));  // mean of nothing
}

TEST(SmoothL1Loss, Errors) {
  expect_error([] { smooth_l1_loss(zeros({2}), zeros({2}), -0.5); },
               "smooth_l1_loss: beta must be >= 0, got -0.5");
  expect_error([] { smooth_l1_loss(zeros({2}), zeros({3})); },
               "smooth_l1_loss: input shape [2] does not match target shape [3]");
}

TEST(Metrics, Argmax) {
  Tensor x = f32({1, 3, 3, 5, 2, 0}, {2, 3});
  // Row 0: 3 at indices 1 and 2, the lower wins; row 1: 5 at 0.
  Tensor rows = argmax(x, 1);
  EXPECT_EQ(rows.dtype(), DType::i64);
  EXPECT_EQ(rows.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(argmax(x, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(argmax(x, -1, true).shape(), (Shape{2, 1}));
  // [2, 3, 2] over dim 1: columns (0, 2, 1) -> 1, (5, 1, 1) -> 0, (3, 3, 0) -> 0, (3, 4, 9) -> 2.
  Tensor y = f32({0, 5, 2, 1, 1, 1, 3, 3, 3, 4, 0, 9}, {2, 3, 2});
  EXPECT_EQ(argmax(y, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0, 2}));
  EXPECT_EQ(argmax(f32({1, NAN, 3}, {3}), 0).item(), 1.0);  // NaN is the maximum
  Tensor g = f32({1, 2}, {2});
  g.set_requires_grad(true);
  EXPECT_FALSE(argmax(g, 0).requires_grad());
  expect_error([] { argmax(zeros({2, 0}), 1); }, "empty dimension");
}

TEST(Metrics, TopkCorrectAndAccuracy) {
  Tensor logits = f32({0.1f, 0.5f, 0.4f, 0.9f, 0.05f, 0.05f, 0.2f, 0.2f, 0.6f}, {3, 3});
  Tensor target = i64({2, 0, 1});
  // Top-1 per row: 1, 0, 2 -> only row 1 hits.
  EXPECT_EQ(topk_correct(logits, target, 1), 1);
  // Top-2: {1, 2} hits row 0; row 2 is {2, 0} because the 0.2 tie goes to index 0, not 1.
  EXPECT_EQ(topk_correct(logits, target, 2), 2);
  EXPECT_EQ(topk_correct(logits, target, 3), 3);
  EXPECT_NEAR(accuracy(logits, target), 1.0 / 3.0, 1e-12);
  EXPECT_NEAR(accuracy(logits, target, 2), 2.0 / 3.0, 1e-12);
  // Row 1 ties 0.05 at indices 1 and 2: with k = 2 only index 1 makes the cut.
  EXPECT_EQ(topk_correct(logits, i64({0, 1, 0}), 2), 2);
  EXPECT_EQ(topk_correct(logits, i64({0, 2, 0}), 2), 1);
  expect_error([&] { topk_correct(logits, target, 0); }, "k = 0 must be in [1, 3]");
  expect_error([&] { topk_correct(logits, target, 4); }, "k = 4");
  expect_error([&] { topk_correct(logits, i64({0, 3, 0}), 1); }, "target 3 at index 1");
}

}  // namespace
}  // namespace rg
