// Every engine op with a CUDA path, run on cuda:0 against the CPU from the same inputs, forward
// and backward (tests/device/device_test_util.h), in f32 and f64; plus the half types where the
// CPU has no kernels (compared with the f32 CPU result), and the ops that refuse CUDA.
#include <gtest/gtest.h>

#include "device/device_test_util.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/activation.h"
#include "engine/ops/batch_norm.h"
#include "engine/ops/conv2d.h"
#include "engine/ops/dropout.h"
#include "engine/ops/flatten.h"
#include "engine/ops/loss.h"
#include "engine/ops/matmul.h"
#include "engine/ops/metrics.h"
#include "engine/ops/pool.h"
#include "engine/ops/unary.h"
#include "support/errors.h"

namespace rg {
namespace {

using testing::expect_close;
using testing::expect_same_on_device;
using testing::kCuda;
using testing::random_tensor;
using V = std::vector<Tensor>;

class DeviceOps : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { RG_REQUIRE_DEVICE(); }
  Tensor rnd(const Shape& s, double lo = -1.0, double hi = 1.0) {
    return random_tensor(s, gen_, GetParam(), lo, hi);
  }
  Generator gen_{42};
};

TEST_P(DeviceOps, BinarySameShapeScalarBiasPerChannelAndGeneralBroadcast) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{33, 31}, {33, 31}},       // same shape
      {{1000}, {1}},              // one-element tensor
      {{}, {7, 5}},               // 0-d first operand
      {{17, 33}, {33}},           // bias
      {{4, 3, 5, 7}, {3, 1, 1}},  // per channel
      {{3, 1, 1}, {4, 3, 5, 7}},  // per channel, broadcast operand first
      {{6, 1, 5}, {1, 4, 1}},     // both broadcast: the general kernel
      {{2, 3, 4}, {2, 1, 4}},     // a gap of ones: the general kernel
  };
  for (const auto& [sa, sb] : shapes) {
    const Tensor a = rnd(sa), b = rnd(sb, 0.5, 1.5);  // b away from 0 for div
    const std::string w = shape_str(sa) + " op " + shape_str(sb);
    expect_same_on_device("add " + w, [](const V& v) { return add(v[0], v[1]); }, {a, b});
    expect_same_on_device("sub " + w, [](const V& v) { return sub(v[0], v[1]); }, {a, b});
    expect_same_on_device("mul " + w, [](const V& v) { return mul(v[0], v[1]); }, {a, b});
    expect_same_on_device("div " + w, [](const V& v) { return div(v[0], v[1]); }, {a, b});
  }
}

TEST_P(DeviceOps, ScalarOps) {
  const Tensor a = rnd({4097}, 0.5, 2.0);
  expect_same_on_device("add s", [](const V& v) { return add(v[0], 1.5); }, {a});
  expect_same_on_device("mul s", [](const V& v) { return mul(v[0], -3.0); }, {a});
  expect_same_on_device("div s", [](const V& v) { return div(v[0], 7.0); }, {a});
  expect_same_on_device("rsub", [](const V& v) { return rsub(v[0], 2.0); }, {a});
  expect_same_on_device("rdiv", [](const V& v) { return rdiv(v[0], 2.0); }, {a});
}

TEST_P(DeviceOps, UnaryOps) {
  const Tensor a = rnd({31, 33}, 0.25, 3.0);  // positive, for log and sqrt
  expect_same_on_device("neg", [](const V& v) { return neg(v[0]); }, {a});
  expect_same_on_device("exp", [](const V& v) { return exp(v[0]); }, {a});
  expect_same_on_device("log", [](const V& v) { return log(v[0]); }, {a});
  expect_same_on_device("sqrt", [](const V& v) { return sqrt(v[0]); }, {a});
  for (double p : {0.0, 1.0, 2.0, 3.0, 0.5}) {
    expect_same_on_device("pow " + std::to_string(p), [p](const V& v) { return pow(v[0], p); },
                          {a});
  }
}

TEST_P(DeviceOps, Activations) {
  const Tensor a = rnd({1000}, -3.0, 3.0);
  expect_same_on_device("relu", [](const V& v) { return relu(v[0]); }, {a});
  expect_same_on_device("leaky_relu", [](const V& v) { return leaky_relu(v[0], 0.2); }, {a});
  expect_same_on_device("gelu", [](const V& v) { return gelu(v[0]); }, {a});
  expect_same_on_device("gelu tanh", [](const V& v) { return gelu(v[0], true); }, {a});
  expect_same_on_device("sigmoid", [](const V& v) { return sigmoid(v[0]); }, {a});
  expect_same_on_device("tanh", [](const V& v) { return tanh(v[0]); }, {a});
}

TEST_P(DeviceOps, Reductions) {
  const Tensor a = rnd({5, 33, 7});
  expect_same_on_device("sum", [](const V& v) { return sum(v[0]); }, {a});
  expect_same_on_device("mean", [](const V& v) { return mean(v[0]); }, {a});
  expect_same_on_device("sum dim 1", [](const V& v) { return sum(v[0], {1}); }, {a});
  expect_same_on_device("sum dims 0,2 keepdim",
                        [](const V& v) {
                          return sum(v[0], {0, 2}, true);
                        },
                        {a});
  expect_same_on_device("mean dim -1", [](const V& v) { return mean(v[0], {-1}); }, {a});
  expect_same_on_device("sum of 4097", [](const V& v) { return sum(v[0]); }, {rnd({4097})});
}

TEST_P(DeviceOps, SoftmaxAndLosses) {
  const Tensor x = rnd({33, 10}, -4.0, 4.0);
  const Tensor target = from_vector<int64_t>(
      [] {
        std::vector<int64_t> t(33);
        for (size_t i = 0; i < t.size(); ++i) t[i] = int64_t((i * 7) % 10);
        return t;
      }(),
      {33});
  expect_same_on_device("log_softmax dim 1", [](const V& v) { return log_softmax(v[0], 1); }, {x});
  expect_same_on_device("log_softmax dim 0", [](const V& v) { return log_softmax(v[0], 0); }, {x});
  expect_same_on_device("nll_loss", [](const V& v) { return nll_loss(log_softmax(v[0], 1), v[1]); },
                        {x, target});
  for (double eps : {0.0, 0.1}) {
    expect_same_on_device("cross_entropy " + std::to_string(eps),
                          [eps](const V& v) { return cross_entropy(v[0], v[1], eps); },
                          {x, target});
  }
}

TEST_P(DeviceOps, MatmulAndLinear) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{7, 33}, {33, 5}}, {{3, 7, 4}, {3, 4, 5}}, {{3, 7, 4}, {4, 5}}, {{7, 4}, {3, 4, 5}},
      {{33}, {33, 5}},    {{7, 33}, {33}},        {{7, 0}, {0, 5}},  // empty inner dimension: zeros
  };
  for (const auto& [sa, sb] : shapes) {
    expect_same_on_device("matmul " + shape_str(sa) + " x " + shape_str(sb),
                          [](const V& v) { return matmul(v[0], v[1]); }, {rnd(sa), rnd(sb)});
  }
  const Tensor x = rnd({2, 9, 33}), w = rnd({17, 33}), b = rnd({17});
  expect_same_on_device("linear", [](const V& v) { return linear(v[0], v[1], v[2]); }, {x, w, b});
  expect_same_on_device("linear no bias", [](const V& v) { return linear(v[0], v[1]); }, {x, w});
}

TEST_P(DeviceOps, Pooling) {
  const Tensor x = rnd({2, 3, 9, 11});
  expect_same_on_device("max_pool2d",
                        [](const V& v) {
                          return max_pool2d(v[0], {3, 3}, {2, 2}, {1, 1});
                        },
                        {x});
  for (bool pad : {true, false}) {
    expect_same_on_device("avg_pool2d",
                          [pad](const V& v) {
                            return avg_pool2d(v[0], {3, 2}, {2, 1}, {1, 1}, pad);
                          },
                          {x});
  }
  expect_same_on_device("adaptive_avg_pool2d",
                        [](const V& v) {
                          return adaptive_avg_pool2d(v[0], {1, 1});
                        },
                        {x});
  expect_same_on_device("flatten", [](const V& v) { return flatten(v[0]); }, {x});
}

TEST_P(DeviceOps, BatchNormTrainingAndEval) {
  if (GetParam() == DType::f64) {
    const Tensor x = rnd({4, 3}).to(kCuda);
    testing::expect_error(
        [&] { batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5); },
        "f64 is not implemented on CUDA yet");
    return;
  }
  const Tensor x = rnd({4, 3, 5, 5}, -2.0, 3.0), w = rnd({3}), b = rnd({3});
  // Training: the output and gradients, and the running statistics updated alike.
  Tensor rm_cpu = zeros({3}), rv_cpu = ones({3});
  Tensor rm_dev = zeros({3}, DType::f32, kCuda), rv_dev = ones({3}, DType::f32, kCuda);
  int calls = 0;
  expect_same_on_device("batch_norm training",
                        [&](const V& v) {
                          const bool on_cpu = v[0].device().is_cpu();
                          ++calls;
                          return batch_norm(v[0], on_cpu ? rm_cpu : rm_dev,
                                            on_cpu ? rv_cpu : rv_dev, v[1], v[2], true, 0.1, 1e-5);
                        },
                        {x, w, b});
  EXPECT_EQ(calls, 3);  // probe + CPU on the CPU, one on the device: the CPU stats moved twice
  Tensor rm_once = zeros({3}), rv_once = ones({3});
  {
    NoGradGuard no_grad;
    batch_norm(x, rm_once, rv_once, w, b, true, 0.1, 1e-5);
  }
  expect_close(rm_dev, rm_once, 1e-5, 1e-4, "running_mean");
  expect_close(rv_dev, rv_once, 1e-5, 1e-4, "running_var");
  // Evaluation with those statistics.
  expect_same_on_device("batch_norm eval",
                        [&](const V& v) {
                          const bool on_cpu = v[0].device().is_cpu();
                          return batch_norm(v[0], on_cpu ? rm_once : rm_dev,
                                            on_cpu ? rv_once : rv_dev, v[1], v[2], false, 0.1,
                                            1e-5);
                        },
                        {x, w, b});
}

TEST_P(DeviceOps, DropoutMaskMatchesTheCpu) {
  const Tensor x = rnd({4097});
  for (Device d : {Device::cpu(), kCuda}) {
    (void)d;
  }
  Generator g_cpu(7), g_dev(7);
  const Tensor y_cpu = dropout(x, 0.3, true, g_cpu);
  const Tensor y_dev = dropout(x.to(kCuda), 0.3, true, g_dev);
  EXPECT_EQ(g_cpu.offset(), g_dev.offset());
  expect_close(y_dev, y_cpu, 0, 1e-6, "dropout");
  Generator g(9);
  expect_same_on_device("dropout grad",
                        [&g](const V& v) {
                          Generator local(9);
                          return dropout(v[0], 0.5, true, local);
                        },
                        {x});
}

TEST_P(DeviceOps, ArgmaxAndTopk) {
  const Tensor x = rnd({33, 10});
  expect_same_on_device(
      "argmax", [](const V& v) { return argmax(v[0], 1); }, {x}, false);
  expect_same_on_device(
      "argmax dim 0 keepdim", [](const V& v) { return argmax(v[0], 0, true); }, {x}, false);
  const Tensor target = argmax(rnd({33, 10}), 1);
  for (int64_t k : {1, 3, 10}) {
    EXPECT_EQ(topk_correct(x.to(kCuda), target.to(kCuda), k), topk_correct(x, target, k)) << k;
  }
  EXPECT_DOUBLE_EQ(accuracy(x.to(kCuda), target.to(kCuda), 2), accuracy(x, target, 2));
}

TEST_P(DeviceOps, Conv2dThroughCudnn) {
  struct Case {
    Shape x, w;
    std::array<int64_t, 2> stride, padding, dilation;
    bool bias;
  };
  const std::vector<Case> cases = {
      {{2, 3, 9, 11}, {5, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, true},
      {{2, 3, 9, 11}, {4, 3, 3, 2}, {2, 1}, {0, 1}, {1, 1}, false},
      {{1, 2, 10, 10}, {3, 2, 3, 3}, {1, 2}, {2, 2}, {2, 2}, true},
      {{3, 4, 5, 5}, {6, 4, 1, 1}, {1, 1}, {0, 0}, {1, 1}, true},
      // An empty batch: cuDNN refuses zero-sized descriptors, so the kernels answer themselves
      // (no output, zero weight and bias gradients), as the CPU does.
      {{0, 3, 9, 11}, {5, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, true},
  };
  for (const Case& c : cases) {
    const std::string what = "conv2d x" + shape_str(c.x) + " w" + shape_str(c.w);
    const Tensor x = rnd(c.x), w = rnd(c.w);
    const std::vector<Tensor> in = c.bias ? V{x, w, rnd({c.w[0]})} : V{x, w};
    expect_same_on_device(
        what,
        [&c](const V& v) {
          return conv2d(v[0], v[1], v.size() > 2 ? v[2] : Tensor(), c.stride, c.padding,
                        c.dilation);
        },
        in);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DeviceOps, ::testing::Values(DType::f32, DType::f64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

class DeviceTensor : public ::testing::Test {
 protected:
  void SetUp() override { RG_REQUIRE_DEVICE(); }
};

TEST_F(DeviceTensor, FillEveryDtype) {
  for (DType t :
       {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8}) {
    Tensor d = Tensor::empty({1000}, t, kCuda);
    d.fill_(3.0);
    expect_close(d, full({1000}, 3.0, t), 0, 0, std::string("fill_ ") + dtype_name(t));
    d.zero_();
    expect_close(d, zeros({1000}, t), 0, 0, std::string("zero_ ") + dtype_name(t));
  }
}

TEST_F(DeviceTensor, ConversionsOnTheDeviceMatchTheCpu) {
  Generator gen(3);
  const Tensor x = random_tensor({4097}, gen, DType::f32, -70000.0, 70000.0);  // beyond f16 range
  for (DType from : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (DType to : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      const Tensor src = x.to(from);
      const Tensor expected = src.to(to);
      const Tensor actual = src.to(kCuda).to(to);
      EXPECT_TRUE(actual.device().is_cuda());
      EXPECT_EQ(actual.dtype(), to);
      // Bit-identical: one rounding, to nearest even, on both sides.
      expect_close(actual, expected, 0, 0, std::string(dtype_name(from)) + " -> " + dtype_name(to));
    }
  }
  // Integers: floats truncate toward zero (on values every integer type holds), and integers
  // convert to every type, wrapping when they narrow.
  const Tensor small = random_tensor({4097}, gen, DType::f32, 0.0, 250.0);
  const std::vector<DType> all = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                  DType::i64, DType::i32, DType::u8};
  for (DType from : all) {
    const Tensor src = is_floating(from) ? small.to(from) : (small * 300.0).to(DType::i64).to(from);
    for (DType to : all) {
      if (is_floating(from) && is_floating(to)) continue;  // above
      const Tensor actual = src.to(kCuda).to(to);
      EXPECT_EQ(actual.dtype(), to);
      expect_close(actual, src.to(to), 0, 0,
                   std::string(dtype_name(from)) + " -> " + dtype_name(to));
    }
  }
}

TEST_F(DeviceTensor, RandomFillsGiveTheCpuValues) {
  for (DType t : {DType::f32, DType::f64, DType::bf16}) {
    Generator a(5), b(5);
    Tensor h = Tensor::empty({1000}, t), d = Tensor::empty({1000}, t, kCuda);
    uniform_(h, -2.0, 3.0, a);
    uniform_(d, -2.0, 3.0, b);
    expect_close(d, h, 0, 0, std::string("uniform_ ") + dtype_name(t));
    normal_(h, 1.0, 2.0, a);
    normal_(d, 1.0, 2.0, b);
    expect_close(d, h, 0, 0, std::string("normal_ ") + dtype_name(t));
  }
}

TEST_F(DeviceTensor, HalfTypesComputeLikeF32) {
  Generator gen(11);
  const Tensor x = random_tensor({9, 33}, gen), w = random_tensor({17, 33}, gen),
               b = random_tensor({17}, gen);
  const Tensor expected = relu(linear(x, w, b));
  for (DType t : {DType::f16, DType::bf16}) {
    const Tensor out = relu(linear(x.to(t).to(kCuda), w.to(t).to(kCuda), b.to(t).to(kCuda)));
    EXPECT_EQ(out.dtype(), t);
    const testing::Tolerance tol = testing::tolerance_for(t);
    expect_close(out, expected, 4 * tol.atol + 0.05, 4 * tol.rtol, dtype_name(t));
  }
}

TEST_F(DeviceTensor, MismatchedDevicesAndDtypesAreClearErrors) {
  const Tensor x = zeros({1, 1, 4, 4}, DType::f32, kCuda);
  testing::expect_error([&] { add(x, zeros({1, 1, 4, 4})); }, "device mismatch");
  testing::expect_error([&] { relu(zeros({3}, DType::i64, kCuda)); },
                        "expected a floating-point tensor");
}

}  // namespace
}  // namespace rg
