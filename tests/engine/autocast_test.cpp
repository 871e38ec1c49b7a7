// engine/autocast.h on the CPU: the guard's scoping, the numbers of a lower-precision op (the
// half-rounded inputs with f32 accumulation, rounded once), f32 master weights, batch norm's
// half activations with f32 statistics, and backward without autocast. Which dtype each op runs
// in is checked for every op-table entry against PyTorch's lists (OpTable.AutocastFollows...).
#include "engine/autocast.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "engine/generator.h"
#include "engine/ops/activation.h"
#include "engine/ops/batch_norm.h"
#include "engine/ops/binary.h"
#include "engine/ops/conv2d.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/ops/matmul.h"
#include "engine/ops/reduce.h"
#include "support/errors.h"
#include "support/gradcheck.h"

namespace rg {
namespace {

// Uniform in [-1, 1), as `dtype`, not requiring grad.
Tensor random_tensor(const Shape& shape, Generator& gen, DType dtype) {
  return testing::random_input(shape, gen).detach().to(dtype);
}

TEST(Autocast, GuardsNestAndRestore) {
  EXPECT_FALSE(autocast_enabled(DeviceType::cpu));
  EXPECT_EQ(autocast_dtype(DeviceType::cpu), DType::bf16);  // PyTorch's defaults
  EXPECT_EQ(autocast_dtype(DeviceType::cuda), DType::f16);
  {
    const AutocastGuard outer(DeviceType::cpu, DType::f16);
    EXPECT_TRUE(autocast_enabled(DeviceType::cpu));
    EXPECT_FALSE(autocast_enabled(DeviceType::cuda));  // per device type
    EXPECT_EQ(autocast_dtype(DeviceType::cpu), DType::f16);
    {
      const AutocastGuard off(DeviceType::cpu, DType::bf16, false);
      EXPECT_FALSE(autocast_enabled(DeviceType::cpu));
      {
        const NoAutocastGuard none;
        EXPECT_FALSE(autocast_enabled(DeviceType::cuda));
      }
    }
    EXPECT_TRUE(autocast_enabled(DeviceType::cpu));
    EXPECT_EQ(autocast_dtype(DeviceType::cpu), DType::f16);
  }
  EXPECT_FALSE(autocast_enabled(DeviceType::cpu));
  EXPECT_EQ(autocast_dtype(DeviceType::cpu), DType::bf16);
}

TEST(Autocast, OnlyHalfTypesAreLowerPrecision) {
  testing::expect_error([] { AutocastGuard g(DeviceType::cpu, DType::f32); },
                        "autocast: the lower-precision dtype must be f16 or bf16, got f32");
}

// linear under autocast = the f32 GEMM of the bf16-rounded operands, rounded to bf16 once.
TEST(Autocast, LinearRoundsItsInputsAndItsResultOnce) {
  Generator gen(3);
  const Tensor x = random_tensor({7, 33}, gen, DType::f32);
  const Tensor w = random_tensor({5, 33}, gen, DType::f32);
  const Tensor b = random_tensor({5}, gen, DType::f32);
  Tensor y;
  {
    const AutocastGuard autocast(DeviceType::cpu, DType::bf16);
    y = linear(x, w, b);
  }
  ASSERT_EQ(y.dtype(), DType::bf16);
  const auto round = [](const Tensor& t) { return t.to(DType::bf16).to(DType::f32); };
  const Tensor expected = linear(round(x), round(w), round(b)).to(DType::bf16);
  EXPECT_EQ(y.to_vector<float>(), expected.to_vector<float>());
  // And it differs from the plain f32 result (the test can tell the two apart).
  EXPECT_NE(y.to(DType::f32).to_vector<float>(), linear(x, w, b).to_vector<float>());
}

// f32 parameters stay f32 and get f32 gradients; the f64 ones are never cast.
TEST(Autocast, MasterWeightsKeepTheirDtypeAndF64IsNotCast) {
  Generator gen(4);
  Tensor w = random_tensor({4, 3, 3, 3}, gen, DType::f32);
  w.set_requires_grad(true);
  const Tensor x = random_tensor({2, 3, 6, 6}, gen, DType::f32);
  const Tensor x64 = random_tensor({2, 3}, gen, DType::f64);
  const Tensor w64 = random_tensor({4, 3}, gen, DType::f64);
  Tensor loss;
  {
    const AutocastGuard autocast(DeviceType::cpu, DType::bf16);
    const Tensor y = conv2d(x, w);
    EXPECT_EQ(y.dtype(), DType::bf16);
    loss = mean(y);
    EXPECT_EQ(loss.dtype(), DType::bf16);  // mean follows its input
    EXPECT_EQ(matmul(x64, w64.view({3, 4})).dtype(), DType::f64);
  }
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(w.dtype(), DType::f32);
}

// A BatchNorm2d under autocast: bf16 activations, f32 weight, bias and running statistics. The
// result is bf16, computed in f32; the statistics are updated in place in f32.
TEST(Autocast, BatchNormTakesHalfActivationsWithF32Statistics) {
  Generator gen(5);
  const Tensor x = random_tensor({4, 3, 5, 5}, gen, DType::f32);
  Tensor weight = random_tensor({3}, gen, DType::f32), bias = random_tensor({3}, gen, DType::f32);
  weight.set_requires_grad(true);
  Tensor rm = zeros({3}), rv = ones({3});
  Tensor rm_ref = zeros({3}), rv_ref = ones({3});
  const Tensor xh = x.to(DType::bf16);
  const Tensor y = batch_norm(xh, rm, rv, weight, bias, true, 0.1, 1e-5);
  EXPECT_EQ(y.dtype(), DType::bf16);
  const Tensor expected =
      batch_norm(xh.to(DType::f32), rm_ref, rv_ref, weight.detach(), bias, true, 0.1, 1e-5);
  EXPECT_EQ(y.to_vector<float>(), expected.to(DType::bf16).to_vector<float>());
  EXPECT_EQ(rm.dtype(), DType::f32);
  EXPECT_EQ(rm.to_vector<float>(), rm_ref.to_vector<float>());
  EXPECT_EQ(rv.to_vector<float>(), rv_ref.to_vector<float>());
  EXPECT_NE(rm.to_vector<float>(), zeros({3}).to_vector<float>());
  sum(y).backward();
  EXPECT_EQ(weight.grad().dtype(), DType::f32);
}

// Backward runs with autocast off even when called inside the guard: every gradient keeps its
// input's dtype. (Under autocast, AddBackward's reduction of the broadcast operand, a sum, would
// run in f32 and hand the bf16 bias an f32 gradient.)
TEST(Autocast, BackwardInsideTheGuardIsNotAutocast) {
  Generator gen(6);
  Tensor x = random_tensor({3, 4}, gen, DType::bf16), b = random_tensor({4}, gen, DType::bf16);
  x.set_requires_grad(true);
  b.set_requires_grad(true);
  const AutocastGuard autocast(DeviceType::cpu, DType::bf16);
  const Tensor loss = sum(add(x, b));
  EXPECT_EQ(loss.dtype(), DType::f32);
  loss.backward();
  ASSERT_TRUE(b.grad().defined());
  EXPECT_EQ(b.grad().dtype(), DType::bf16);
  EXPECT_EQ(b.grad().to_vector<float>(), std::vector<float>(4, 3.0f));
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
}

// Binary ops promote mixed floating inputs under autocast (as PyTorch always does) and refuse
// them outside it (ringgrad asks for an explicit .to()).
TEST(Autocast, BinaryOpsPromoteMixedInputs) {
  const Tensor a = ones({2, 2}), b = ones({2, 2}, DType::bf16);
  {
    const AutocastGuard autocast(DeviceType::cpu, DType::bf16);
    EXPECT_EQ(add(a, b).dtype(), DType::f32);
    EXPECT_EQ(mul(b, b).dtype(), DType::bf16);
    EXPECT_EQ(add(b, ones({2, 2}, DType::f16)).dtype(), DType::f32);  // f16 with bf16: f32
  }
  testing::expect_error([&] { add(a, b); },
                        "add: dtype mismatch, input 0 is f32 but input 1 is bf16");
}

// A half tensor used twice (a residual connection) gets its gradient accumulated in place, in
// its own dtype, on the CPU too (add_ takes the f32 route); add_ and mul_ directly as well.
TEST(Autocast, HalfGradientsAccumulateOnTheCpu) {
  Generator gen(8);
  Tensor w = random_tensor({3, 3, 3, 3}, gen, DType::f32);
  w.set_requires_grad(true);
  const Tensor x = random_tensor({2, 3, 5, 5}, gen, DType::f32);
  Tensor loss;
  {
    const AutocastGuard autocast(DeviceType::cpu, DType::bf16);
    const Tensor y = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
    loss = sum(add(relu(y), y));  // y feeds two ops: its gradient is a sum
  }
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  Tensor a = full({5}, 1.5, DType::bf16);
  const Tensor b = full({5}, 0.25, DType::bf16);
  add_(a, b, 2.0);
  mul_(a, 2.0);
  EXPECT_EQ(a.dtype(), DType::bf16);
  EXPECT_EQ(a.to_vector<float>(), std::vector<float>(5, 4.0f));
}

// f32 -> f16 -> f32 through Tensor::to (the F16C loops where the CPU has them, eight at a time,
// and the scalar tail) rounds exactly as float_to_half: ties to even, subnormals, overflow, inf.
TEST(Autocast, F16CastsRoundLikeTheScalarConversion) {
  std::vector<float> v = {1.0f + 1.0f / 2048,  // a tie: rounds down to even
                          1.0f + 3.0f / 2048,  // a tie: rounds up to even
                          65504.0f, 65520.0f, 1e6f, -1e6f, 6e-8f, 3e-8f, 1e-5f, -2.5e-6f,
                          std::numeric_limits<float>::infinity(), -0.0f, 0.1f, 1.0f / 3};
  Generator gen(9);
  for (double x : testing::random_input({1000}, gen, -70000, 70000).to_vector<double>())
    v.push_back(float(x));
  const Tensor t = from_vector<float>(v, {int64_t(v.size())});
  const std::vector<float> back = t.to(DType::f16).to(DType::f32).to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i)
    EXPECT_EQ(back[i], half_to_float(float_to_half(v[i]))) << "element " << i << " = " << v[i];
}

}  // namespace
}  // namespace rg
