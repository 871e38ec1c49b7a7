// The TF32 contract on a device (engine/tf32.h): an f32 convolution and an f32 matrix product
// stay within TF32's stated tolerance when their switch allows TF32 and match the CPU's f32 when
// it is off. On the emulator the cuBLAS and cuDNN stand-ins round their inputs to TF32 as tensor
// cores do, and the tests also check that the rounding shows; on a GPU the library decides.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "device/device_test_util.h"
#include "engine/cuda/runtime.h"
#include "engine/ops/conv2d.h"
#include "engine/ops/matmul.h"

namespace rg::testing {
namespace {

// f's output and input gradients on `device` in `dtype` (inputs converted from f64).
std::vector<Tensor> passes(const DeviceFn& f, const std::vector<Tensor>& inputs64,
                           const Tensor& upstream64, Device device, DType dtype) {
  std::vector<Tensor> in;
  for (const Tensor& t : inputs64) in.push_back(t.to(dtype));
  const DeviceResult r = run_on(device, f, in, upstream64.to(dtype));
  std::vector<Tensor> all = {r.out};
  all.insert(all.end(), r.grads.begin(), r.grads.end());
  return all;
}

// Runs f (forward and the input gradients) in f32 on the device under `conv`/`matmul` TF32
// switches and checks it against the CPU: with `expect_tf32` within kTf32Tolerance of the CPU's
// f32 (on the emulator also more than 16 times the CPU's f32 error against the f64 truth);
// without, within f32's tolerance.
void check(const std::string& what, const DeviceFn& f, const std::vector<Tensor>& inputs64,
           bool conv, bool matmul, bool expect_tf32) {
  Generator gen(99);
  const Tensor probe = f(inputs64);
  const Tensor upstream = random_tensor(probe.shape(), gen, DType::f64);
  const std::vector<Tensor> truth = passes(f, inputs64, upstream, Device::cpu(), DType::f64);
  const std::vector<Tensor> cpu = passes(f, inputs64, upstream, Device::cpu(), DType::f32);
  std::vector<Tensor> dev;
  {
    const cuda::Tf32Guard switches(conv, matmul);
    dev = passes(f, inputs64, upstream, kCuda, DType::f32);
  }
  const Tolerance f32_tol = tolerance_for(DType::f32);
  for (size_t i = 0; i < truth.size(); ++i) {
    const std::string part = what + (i == 0 ? " forward" : " grad of input " + std::to_string(i));
    const double cpu_err = relative_error(cpu[i], truth[i]);
    const double dev_err = relative_error(dev[i], truth[i]);
    SCOPED_TRACE(part + ": relative error " + std::to_string(dev_err) + " on the device, " +
                 std::to_string(cpu_err) + " on the CPU");
    if (expect_tf32) {
      // Allowing TF32 is a permission: real cuDNN may still pick an f32 algorithm (on an H200 it
      // did for this small convolution), so only the emulator, which always takes TF32 when
      // allowed, must show its rounding.
      if (cuda::runtime().backend().emulated()) {
        EXPECT_GT(dev_err, 16 * cpu_err) << "TF32 was allowed but the result is as exact as f32";
      }
      expect_close(dev[i], cpu[i], kTf32Tolerance.atol, kTf32Tolerance.rtol, part);
    } else {
      expect_close(dev[i], cpu[i], f32_tol.atol, f32_tol.rtol, part);
    }
  }
}

const DeviceFn kConv = [](const std::vector<Tensor>& v) {
  return conv2d(v[0], v[1], Tensor(), {1, 1}, {1, 1});
};
const DeviceFn kMatmul = [](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); };
const DeviceFn kLinear = [](const std::vector<Tensor>& v) {
  return linear(v[0], v[1], v.size() > 2 ? v[2] : Tensor());
};

class Tf32OnDevice : public ::testing::Test {
 protected:
  void SetUp() override { RG_REQUIRE_DEVICE(); }
  Generator gen{2024};
  Tensor uniform(const Shape& s) { return random_tensor(s, gen, DType::f64); }
};

TEST_F(Tf32OnDevice, DefaultsArePytorchs) {
  EXPECT_TRUE(cuda::allow_tf32_conv());
  EXPECT_FALSE(cuda::allow_tf32_matmul());
}

// 16 channels x 3 x 3: 144 products per output, 4 x 12 x 12 per weight gradient.
TEST_F(Tf32OnDevice, ConvolutionFollowsItsSwitch) {
  const std::vector<Tensor> in = {uniform({4, 16, 12, 12}), uniform({8, 16, 3, 3})};
  check("conv2d, TF32 allowed", kConv, in, /*conv=*/true, /*matmul=*/false, true);
  check("conv2d, TF32 off", kConv, in, false, false, false);
  check("conv2d, only matmul TF32", kConv, in, false, true, false);
}

TEST_F(Tf32OnDevice, MatrixProductsFollowTheirSwitch) {
  const std::vector<Tensor> mm = {uniform({48, 256}), uniform({256, 40})};
  check("matmul, TF32 allowed", kMatmul, mm, /*conv=*/false, /*matmul=*/true, true);
  check("matmul, TF32 off", kMatmul, mm, false, false, false);
  check("matmul, only conv TF32 (the defaults)", kMatmul, mm, true, false, false);
  // The bias and its gradient (a sum) are not products: TF32 is checked without them.
  const Tensor x = uniform({32, 200}), w = uniform({24, 200});
  check("linear, TF32 allowed", kLinear, {x, w}, false, true, true);
  check("linear, the defaults", kLinear, {x, w, uniform({24})}, true, false, false);
}

}  // namespace
}  // namespace rg::testing
