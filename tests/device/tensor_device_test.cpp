// Tensors on cuda:0 against the CPU: fills, dtype conversions, random fills, half-type compute and
// mismatch errors. Every op's own CPU-vs-CUDA comparison is the op table's (tests/ops).
#include <gtest/gtest.h>

#include "device/device_test_util.h"
#include "engine/ops/activation.h"
#include "engine/ops/matmul.h"
#include "support/errors.h"

namespace rg {
namespace {

using testing::expect_close;
using testing::kCuda;
using testing::random_tensor;

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
