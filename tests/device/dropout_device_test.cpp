// dropout on cuda:0 draws the CPU's mask from the same generator state and advances the generator
// as far (the values themselves are the op table's comparison, tests/ops).
#include <gtest/gtest.h>

#include "device/device_test_util.h"
#include "engine/ops/dropout.h"

namespace rg {
namespace {

using testing::kCuda;

TEST(DeviceDropout, AdvancesTheGeneratorLikeTheCpu) {
  RG_REQUIRE_DEVICE();
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    Generator gen(3);
    const Tensor x = testing::random_tensor({4097}, gen, DType::f32).to(dtype);
    Generator g_cpu(7), g_dev(7);
    // The CPU has no half kernels: it computes in f32 on the same rounded values.
    const bool half = dtype == DType::f16 || dtype == DType::bf16;
    const Tensor y_cpu = dropout(x.to(half ? DType::f32 : dtype), 0.3, true, g_cpu);
    const Tensor y_dev = dropout(x.to(kCuda), 0.3, true, g_dev);
    EXPECT_EQ(g_cpu.offset(), g_dev.offset()) << dtype_name(dtype);
    // Kept elements are scaled by 1/(1-p) in every dtype (f16/bf16 once scaled by a denormal).
    const testing::Tolerance tol = testing::tolerance_for(dtype);
    testing::expect_close(y_dev, y_cpu, tol.atol, tol.rtol, dtype_name(dtype));
  }
}

}  // namespace
}  // namespace rg
