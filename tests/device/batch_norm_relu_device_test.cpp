// The fused batch_norm_relu and batch_norm_add_relu against their compositions
// relu(batch_norm(...)) and relu(batch_norm(...) + residual): bit for bit on the CPU
// and, with our kernels on both sides (set_cudnn_enabled(false)), on cuda:0; within f32's
// tolerance of the cuDNN batch norm that f32 takes by default. Forward, every gradient and the
// running statistics, training and evaluation. The ResNet-18 block uses the fused op
// (layers/models/resnet.cpp), so this is what makes its results those of the unfused model.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device/device_test_util.h"
#include "engine/autograd/node.h"
#include "engine/ops/activation.h"
#include "engine/ops/batch_norm.h"
#include "engine/ops/binary.h"
#include "engine/ops/cudnn.h"
#include "engine/ops/reduce.h"

namespace rg {
namespace {

using testing::DeviceResult;
using testing::kCuda;
using testing::random_tensor;
using testing::run_on;
using V = std::vector<Tensor>;

struct Outcome {
  DeviceResult result;
  Tensor running_mean, running_var;
};

// Inputs x, weight, bias (and with `residual` a fourth, added before relu) on `device` (values
// spread so that about half are cut by relu); running statistics (constants) updated in training.
Outcome run(bool fused, Device device, DType dtype, bool training, bool residual = false) {
  Generator gen(21);
  const Tensor x = random_tensor({4, 3, 5, 7}, gen, dtype, -2.0, 3.0);
  const Tensor w = random_tensor({3}, gen, dtype, 0.5, 1.5);
  const Tensor b = random_tensor({3}, gen, dtype, -0.5, 0.5);
  const Tensor upstream = random_tensor({4, 3, 5, 7}, gen, dtype);
  const Tensor res = random_tensor({4, 3, 5, 7}, gen, dtype, -1.0, 1.0);
  Outcome r;
  r.running_mean = random_tensor({3}, gen, dtype, -0.2, 0.2).to(device);
  r.running_var = random_tensor({3}, gen, dtype, 0.5, 1.5).to(device);
  const auto f = [&](const V& v) {
    if (residual) {
      return fused ? batch_norm_add_relu(v[0], v[3], r.running_mean, r.running_var, v[1], v[2],
                                         training)
                   : relu(add(batch_norm(v[0], r.running_mean, r.running_var, v[1], v[2],
                                         training),
                              v[3]));
    }
    return fused ? batch_norm_relu(v[0], r.running_mean, r.running_var, v[1], v[2], training)
                 : relu(batch_norm(v[0], r.running_mean, r.running_var, v[1], v[2], training));
  };
  r.result = run_on(device, f, residual ? V{x, w, b, res} : V{x, w, b}, upstream);
  return r;
}

void expect_identical(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const Tensor a64 = a.to(Device::cpu()).to(DType::f64), b64 = b.to(Device::cpu()).to(DType::f64);
  const auto av = a64.to_vector<double>(), bv = b64.to_vector<double>();
  ASSERT_EQ(av.size(), bv.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < av.size(); ++i) differ += av[i] != bv[i];
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << av.size() << " values differ";
}

void expect_fused_equals_composition(Device device, DType dtype, bool training,
                                     const std::string& what, bool residual = false) {
  const Outcome fused = run(true, device, dtype, training, residual);
  const Outcome composed = run(false, device, dtype, training, residual);
  expect_identical(fused.result.out, composed.result.out, what + " forward");
  const char* names[] = {"x", "weight", "bias", "residual"};
  for (size_t i = 0; i < (residual ? 4u : 3u); ++i) {
    expect_identical(fused.result.grads[i], composed.result.grads[i],
                     what + " grad of " + names[i]);
  }
  expect_identical(fused.running_mean, composed.running_mean, what + " running_mean");
  expect_identical(fused.running_var, composed.running_var, what + " running_var");
  // Some values are cut and some pass: the mask matters.
  const auto out = fused.result.out.to(Device::cpu()).to(DType::f64).to_vector<double>();
  size_t zeros = 0;
  for (double v : out) zeros += v == 0.0;
  EXPECT_GT(zeros, out.size() / 5) << what;
  EXPECT_LT(zeros, out.size() * 4 / 5) << what;
}

TEST(BatchNormRelu, EqualsTheCompositionBitForBitOnTheCpu) {
  for (DType dtype : {DType::f32, DType::f64}) {
    for (bool training : {true, false}) {
      expect_fused_equals_composition(Device::cpu(), dtype, training,
                                      std::string("cpu ") + dtype_name(dtype) +
                                          (training ? " training" : " eval"));
    }
  }
}

// relu(batch_norm(x) + residual) as one op (a ResNet block's end), against the composition.
TEST(BatchNormAddRelu, EqualsTheCompositionBitForBitOnTheCpu) {
  for (DType dtype : {DType::f32, DType::f64}) {
    for (bool training : {true, false}) {
      expect_fused_equals_composition(Device::cpu(), dtype, training,
                                      std::string("add_relu cpu ") + dtype_name(dtype) +
                                          (training ? " training" : " eval"),
                                      true);
    }
  }
}

// Our batch-norm kernels on CUDA while it lives.
struct CudnnOff {
  CudnnOff() { set_cudnn_enabled(false); }
  ~CudnnOff() { set_cudnn_enabled(true); }
};

TEST(BatchNormRelu, EqualsTheCompositionBitForBitOnCudaWithOurKernels) {
  RG_REQUIRE_DEVICE();
  const CudnnOff ours;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (bool training : {true, false}) {
      expect_fused_equals_composition(kCuda, dtype, training,
                                      std::string("cuda ") + dtype_name(dtype) +
                                          (training ? " training" : " eval"));
    }
  }
}

TEST(BatchNormAddRelu, EqualsTheCompositionBitForBitOnCudaWithOurKernels) {
  RG_REQUIRE_DEVICE();
  const CudnnOff ours;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (bool training : {true, false}) {
      expect_fused_equals_composition(kCuda, dtype, training,
                                      std::string("add_relu cuda ") + dtype_name(dtype) +
                                          (training ? " training" : " eval"),
                                      true);
    }
  }
}

// Only the residual wants a gradient (x and the parameters are constants), and the input as its
// own residual (both gradients summed into one): the composition's results, bit for bit.
void expect_residual_cases_match_the_composition(Device device, const std::string& where) {
  Generator gen(27);
  const Tensor x0 = random_tensor({2, 3, 4, 5}, gen, DType::f32, -2.0, 3.0).to(device);
  const Tensor w = random_tensor({3}, gen, DType::f32, 0.5, 1.5).to(device);
  const Tensor b = random_tensor({3}, gen, DType::f32, -0.5, 0.5).to(device);
  const Tensor r0 = random_tensor({2, 3, 4, 5}, gen, DType::f32, -1.0, 1.0).to(device);
  const Tensor up = random_tensor({2, 3, 4, 5}, gen, DType::f32).to(device);
  const auto op = [&](bool fused, const Tensor& x, const Tensor& r) {
    return fused ? batch_norm_add_relu(x, r, Tensor(), Tensor(), w, b, true)
                 : relu(add(batch_norm(x, Tensor(), Tensor(), w, b, true), r));
  };
  std::vector<Tensor> out[2], grad[2];
  for (bool fused : {true, false}) {
    Tensor r = r0.detach().clone();
    r.set_requires_grad(true);
    const Tensor y = op(fused, x0, r);
    sum(mul(y, up)).backward();
    Tensor x = x0.detach().clone();
    x.set_requires_grad(true);
    const Tensor y2 = op(fused, x, x);
    sum(mul(y2, up)).backward();
    out[fused] = {y, y2};
    grad[fused] = {r.grad(), x.grad()};
  }
  for (size_t i = 0; i < 2; ++i) {
    const std::string what = where + (i == 0 ? " residual alone" : " x as its own residual");
    expect_identical(out[1][i], out[0][i], what + " forward");
    ASSERT_TRUE(grad[1][i].defined()) << what;
    expect_identical(grad[1][i], grad[0][i], what + " gradient");
  }
}

TEST(BatchNormAddRelu, ResidualAloneOrTheInputAsItsOwnResidualMatchTheComposition) {
  expect_residual_cases_match_the_composition(Device::cpu(), "cpu");
  if (cuda::runtime().device_count() > 0) {
    const CudnnOff ours;
    expect_residual_cases_match_the_composition(kCuda, "cuda");
  }
}

// f16/bf16 activations with f32 parameters and statistics (autocast's BatchNorm2d) on CUDA: our
// kernels take them as they are (no f32 copies of the activation, the output or the gradients),
// bit for bit what the f32 kernels give on the activation converted to f32 with the output
// converted back (the way the mixed case went before, and still goes on the CPU): forward, every
// gradient (weight and bias in f32) and the running statistics. batch_norm_add_relu against the
// mixed batch_norm, then the half add and relu.
Outcome run_mixed(bool through_f32, int op, DType dtype, bool training) {
  Generator gen(23);
  const Tensor x = random_tensor({4, 3, 5, 7}, gen, dtype, -2.0, 3.0);
  const Tensor w = random_tensor({3}, gen, DType::f32, 0.5, 1.5);
  const Tensor b = random_tensor({3}, gen, DType::f32, -0.5, 0.5);
  const Tensor res = random_tensor({4, 3, 5, 7}, gen, dtype, -1.0, 1.0);
  const Tensor upstream = random_tensor({4, 3, 5, 7}, gen, dtype);
  Outcome r;
  r.running_mean = random_tensor({3}, gen, DType::f32, -0.2, 0.2).to(kCuda);
  r.running_var = random_tensor({3}, gen, DType::f32, 0.5, 1.5).to(kCuda);
  const auto f = [&](const V& v) {
    const Tensor& rm = r.running_mean;
    const Tensor& rv = r.running_var;
    if (!through_f32) {
      const Tensor out = op == 0   ? batch_norm(v[0], rm, rv, v[1], v[2], training)
                         : op == 1 ? batch_norm_relu(v[0], rm, rv, v[1], v[2], training)
                                   : batch_norm_add_relu(v[0], v[3], rm, rv, v[1], v[2], training);
      const char* node[] = {"BatchNormBackward", "BatchNormReluBackward",
                            "BatchNormAddReluBackward"};
      EXPECT_EQ(out.grad_fn()->name(), node[op]) << "no conversion around the batch norm";
      return out;
    }
    if (op == 2) return relu(add(batch_norm(v[0], rm, rv, v[1], v[2], training), v[3]));
    const Tensor y = op == 0 ? batch_norm(v[0].to(DType::f32), rm, rv, v[1], v[2], training)
                             : batch_norm_relu(v[0].to(DType::f32), rm, rv, v[1], v[2], training);
    return y.to(dtype);
  };
  r.result = run_on(kCuda, f, op == 2 ? V{x, w, b, res} : V{x, w, b}, upstream);
  return r;
}

TEST(MixedPrecisionBatchNorm, HalfActivationsTakeF32ParametersWithoutConversions) {
  RG_REQUIRE_DEVICE();
  const CudnnOff ours;  // the f32 reference on our kernels too
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (int op : {0, 1, 2}) {
      for (bool training : {true, false}) {
        const std::string what = std::string(dtype_name(dtype)) + " op " + std::to_string(op) +
                                 (training ? " training" : " eval");
        const Outcome mixed = run_mixed(false, op, dtype, training);
        const Outcome ref = run_mixed(true, op, dtype, training);
        expect_identical(mixed.result.out, ref.result.out, what + " forward");
        ASSERT_EQ(mixed.result.grads.size(), ref.result.grads.size());
        for (size_t i = 0; i < ref.result.grads.size(); ++i) {
          expect_identical(mixed.result.grads[i], ref.result.grads[i],
                           what + " grad " + std::to_string(i));
        }
        EXPECT_EQ(mixed.result.grads[1].dtype(), DType::f32) << what;
        expect_identical(mixed.running_mean, ref.running_mean, what + " running_mean");
        expect_identical(mixed.running_var, ref.running_var, what + " running_var");
      }
    }
  }
}

// With cuDNN on, f32's unfused batch norm is cuDNN's (f32 statistics), the fused one ours.
TEST(BatchNormRelu, AgreesWithCudnnsBatchNormThenRelu) {
  RG_REQUIRE_DEVICE();
  for (bool training : {true, false}) {
    const std::string what = training ? "training" : "eval";
    const Outcome fused = run(true, kCuda, DType::f32, training);
    const Outcome composed = run(false, kCuda, DType::f32, training);
    testing::expect_close(fused.result.out, composed.result.out, 1e-5, 1e-4, what + " forward");
    for (size_t i = 0; i < 3; ++i) {
      testing::expect_close(fused.result.grads[i], composed.result.grads[i], 1e-4, 1e-4,
                            what + " grad " + std::to_string(i));
    }
    testing::expect_close(fused.running_var, composed.running_var, 1e-6, 1e-5,
                          what + " running_var");
  }
}

}  // namespace
}  // namespace rg
