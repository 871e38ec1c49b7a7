// Batch norm and pooling on cuda:0 through cuDNN and through our own kernels (the fallback that
// set_cudnn_enabled(false) forces), against the CPU from the same values, forward and backward, in
// every CUDA dtype: training and eval, [N, C] inputs, undefined weight and bias, empty batches,
// padding and strides, ties in max pooling. In emulated runs the emulated cuDNN's call counts show
// which path ran.
#include <gtest/gtest.h>

#include <array>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "device/device_test_util.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/batch_norm.h"
#include "engine/ops/cudnn.h"
#include "engine/ops/pool.h"
#include "support/errors.h"
#if defined(RG_CUDA_EMU)
#include "kernels/emu/shim/cudnn.h"
#endif

namespace rg {
namespace {

using testing::DeviceResult;
using testing::expect_close;
using testing::kCuda;
using testing::random_tensor;
using testing::run_on;
using V = std::vector<Tensor>;

// Whether the calls made while it lives include `function` of the emulated cuDNN. On a GPU
// nothing counts them and every expectation holds.
class CudnnCalls {
 public:
  explicit CudnnCalls(std::string_view function) : function_(function), before_(count()) {}
  void expect(bool called, const std::string& what) const {
    const int64_t now = count();
    if (now < 0) return;
    EXPECT_EQ(now > before_, called)
        << what << ": " << function_ << " was called " << now - before_ << " times";
  }

 private:
  int64_t count() const {
#if defined(RG_CUDA_EMU)
    return emu::cudnn_calls(function_);
#else
    return -1;
#endif
  }
  std::string_view function_;
  int64_t before_;
};

// The CPU computes in f32 (f64 for f64), on the values rounded to the device's dtype.
DType reference_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// f on cuda:0 with the floating inputs in dtype t, against f on the CPU with the same values in
// reference_dtype(t): the outputs and, backward of sum(out * upstream), every input's gradient.
void expect_matches_cpu(const std::string& what, DType t, const testing::DeviceFn& f,
                        const V& inputs, double tol_scale = 1.0) {
  const DType ref = reference_dtype(t);
  V dev_in, cpu_in;
  for (const Tensor& x : inputs) {
    const Tensor rounded = is_floating(x.dtype()) ? x.to(t) : x;
    dev_in.push_back(rounded);
    cpu_in.push_back(is_floating(x.dtype()) ? rounded.to(ref) : rounded);
  }
  const Tensor probe = run_on(Device::cpu(), f, cpu_in, Tensor()).out;
  Generator gen(1234);
  const Tensor upstream = random_tensor(probe.shape(), gen, ref).to(t);
  const DeviceResult cpu = run_on(Device::cpu(), f, cpu_in, upstream.to(ref));
  const DeviceResult dev = run_on(kCuda, f, dev_in, upstream);
  ASSERT_TRUE(dev.out.device().is_cuda()) << what;
  ASSERT_EQ(dev.out.dtype(), t) << what;
  const testing::Tolerance tol = testing::tolerance_for(t);
  const double atol = tol.atol * tol_scale, rtol = tol.rtol * tol_scale;
  expect_close(dev.out, cpu.out, atol, rtol, what + " forward");
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    ASSERT_EQ(dev.grads[i].defined(), cpu.grads[i].defined()) << what << " grad " << i;
    if (!cpu.grads[i].defined()) continue;
    EXPECT_EQ(dev.grads[i].dtype(), t) << what << " grad " << i;
    expect_close(dev.grads[i], cpu.grads[i], atol, rtol,
                 what + " grad of input " + std::to_string(i));
  }
}

// (dtype, cuDNN enabled)
class CudnnOps : public ::testing::TestWithParam<std::tuple<DType, bool>> {
 protected:
  void SetUp() override {
    RG_REQUIRE_DEVICE();
    set_cudnn_enabled(cudnn());
  }
  void TearDown() override { set_cudnn_enabled(true); }
  DType dtype() const { return std::get<0>(GetParam()); }
  bool cudnn() const { return std::get<1>(GetParam()); }
  std::string name(const std::string& what) const {
    return what + " " + dtype_name(dtype()) + (cudnn() ? " cuDNN" : " fallback");
  }
  // f32 values; expect_matches_cpu rounds them to the dtype under test.
  Tensor rnd(const Shape& s, double lo = -1.0, double hi = 1.0) {
    return random_tensor(s, gen_, DType::f32, lo, hi);
  }
  // Batch norm runs through cuDNN for f32 and f16 while it is enabled; bf16 and f64 stay on our
  // kernels.
  bool batch_norm_via_cudnn() const {
    return cudnn() && (dtype() == DType::f32 || dtype() == DType::f16);
  }
  // Average pooling: every dtype but bf16.
  bool pool_via_cudnn() const { return cudnn() && dtype() != DType::bf16; }
  Generator gen_{7};
};

TEST_P(CudnnOps, BatchNormTrainingUpdatesTheRunningStatistics) {
  const DType t = dtype(), ref = reference_dtype(t);
  const Tensor x = rnd({4, 3, 5, 5}, -2.0, 3.0), w = rnd({3}), b = rnd({3});
  Tensor rm_dev = zeros({3}, t, kCuda), rv_dev = ones({3}, t, kCuda);
  Tensor rm_cpu = zeros({3}, ref), rv_cpu = ones({3}, ref);  // moved by the probe too: unused
  const CudnnCalls forward("cudnnBatchNormalizationForwardTraining");
  const CudnnCalls backward("cudnnBatchNormalizationBackward");
  expect_matches_cpu(name("batch_norm training"), t,
                     [&](const V& v) {
                       const bool on_cpu = v[0].device().is_cpu();
                       return batch_norm(v[0], on_cpu ? rm_cpu : rm_dev, on_cpu ? rv_cpu : rv_dev,
                                         v[1], v[2], true, 0.1, 1e-5);
                     },
                     {x, w, b});
  forward.expect(batch_norm_via_cudnn(), name("batch_norm training"));
  backward.expect(batch_norm_via_cudnn(), name("batch_norm training backward"));
  // The running statistics moved once, as one CPU step on the same values moves them: running_var
  // with the unbiased variance.
  Tensor rm_once = zeros({3}, ref), rv_once = ones({3}, ref);
  {
    NoGradGuard no_grad;
    batch_norm(x.to(t).to(ref), rm_once, rv_once, w.to(t).to(ref), b.to(t).to(ref), true, 0.1,
               1e-5);
  }
  const testing::Tolerance tol = testing::tolerance_for(t);
  expect_close(rm_dev, rm_once, tol.atol, tol.rtol, name("running_mean"));
  expect_close(rv_dev, rv_once, tol.atol, tol.rtol, name("running_var"));
}

TEST_P(CudnnOps, BatchNormOf2dInputsWithoutAffineOrRunningStatistics) {
  const CudnnCalls forward("cudnnBatchNormalizationForwardTraining");
  expect_matches_cpu(
      name("batch_norm [N, C]"), dtype(),
      [](const V& v) { return batch_norm(v[0], Tensor(), Tensor(), Tensor(), Tensor(), true); },
      {rnd({9, 5}, -1.0, 2.0)});
  forward.expect(batch_norm_via_cudnn(), name("batch_norm [N, C]"));
  // eps = 0 is CUDNN_BN_MIN_EPSILON: still cuDNN's.
  expect_matches_cpu(
      name("batch_norm eps 0"), dtype(),
      [](const V& v) { return batch_norm(v[0], Tensor(), Tensor(), v[1], v[2], true, 0.1, 0.0); },
      {rnd({6, 4, 3, 2}), rnd({4}), rnd({4})});
}

TEST_P(CudnnOps, BatchNormEvalAndItsBackward) {
  const DType t = dtype();
  const Tensor x = rnd({3, 4, 3, 5}, -2.0, 2.0), w = rnd({4}), b = rnd({4});
  const Tensor rm = rnd({4}, -0.5, 0.5), rv = rnd({4}, 0.5, 2.0);
  const Tensor rm_dev = rm.to(t).to(kCuda), rv_dev = rv.to(t).to(kCuda);
  const Tensor rm_cpu = rm.to(t).to(reference_dtype(t)), rv_cpu = rv.to(t).to(reference_dtype(t));
  const CudnnCalls forward("cudnnBatchNormalizationForwardInference");
  const CudnnCalls backward("cudnnBatchNormalizationBackward");
  const auto eval = [&](const V& v) {
    const bool on_cpu = v[0].device().is_cpu();
    return batch_norm(v[0], on_cpu ? rm_cpu : rm_dev, on_cpu ? rv_cpu : rv_dev, v[1], v[2], false,
                      0.1, 1e-5);
  };
  expect_matches_cpu(name("batch_norm eval"), t, eval, {x, w, b});
  forward.expect(batch_norm_via_cudnn(), name("batch_norm eval"));
  backward.expect(false, name("batch_norm eval backward (cuDNN has none)"));
  // Without gradients the forward computes no statistics of its own.
  {
    NoGradGuard no_grad;
    expect_close(eval({x.to(t).to(kCuda), w.to(t).to(kCuda), b.to(t).to(kCuda)}),
                 eval({x.to(t).to(reference_dtype(t)), w.to(t).to(reference_dtype(t)),
                       b.to(t).to(reference_dtype(t))}),
                 testing::tolerance_for(t).atol, testing::tolerance_for(t).rtol,
                 name("batch_norm eval without grad"));
  }
  // 2-d and without weight and bias.
  expect_matches_cpu(name("batch_norm eval [N, C]"), t,
                     [&](const V& v) {
                       const bool on_cpu = v[0].device().is_cpu();
                       return batch_norm(v[0], on_cpu ? rm_cpu : rm_dev, on_cpu ? rv_cpu : rv_dev,
                                         Tensor(), Tensor(), false, 0.1, 1e-5);
                     },
                     {rnd({7, 4})});
}

TEST_P(CudnnOps, BatchNormWeightGradientWithoutInputGradient) {
  const CudnnCalls backward("cudnnBatchNormalizationBackward");
  expect_matches_cpu(name("batch_norm, x without grad"), dtype(),
                     [](const V& v) {
                       return batch_norm(v[0].detach(), Tensor(), Tensor(), v[1], v[2], true, 0.1,
                                         1e-5);
                     },
                     {rnd({5, 3, 2, 2}), rnd({3}), rnd({3})});
  // cuDNN's backward always writes gx: our kernel serves the weight and bias alone.
  backward.expect(false, name("batch_norm, x without grad"));
}

TEST_P(CudnnOps, BatchNormOfAnEmptyBatch) {
  const DType t = dtype();
  const Tensor rm = zeros({3}), rv = ones({3});
  const CudnnCalls forward("cudnnBatchNormalizationForwardInference");
  // Eval: an empty output and zero weight and bias gradients, as on the CPU.
  expect_matches_cpu(name("batch_norm eval, empty batch"), t,
                     [&](const V& v) {
                       const Tensor m = rm.to(t).to(v[0].device()).to(v[0].dtype());
                       const Tensor s = rv.to(t).to(v[0].device()).to(v[0].dtype());
                       return batch_norm(v[0], m, s, v[1], v[2], false, 0.1, 1e-5);
                     },
                     {rnd({0, 3, 4, 4}), rnd({3}), rnd({3})});
  forward.expect(false, name("empty batch: nothing for cuDNN"));
  // Training needs more than one value per channel, on CUDA as on the CPU.
  testing::expect_error(
      [&] {
        batch_norm(zeros({0, 3, 4, 4}, t, kCuda), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      "expected more than 1 value per channel");
}

TEST_P(CudnnOps, AveragePooling) {
  struct Case {
    Shape x;
    std::array<int64_t, 2> kernel, stride, padding;
  };
  const std::vector<Case> cases = {
      {{2, 3, 9, 11}, {3, 2}, {2, 1}, {1, 1}},  // strided, padded
      {{1, 2, 8, 8}, {2, 2}, {0, 0}, {0, 0}},   // stride = kernel
      {{2, 1, 7, 5}, {4, 3}, {3, 2}, {2, 1}},   // padding of half the kernel
      {{3, 2, 5, 6}, {5, 6}, {1, 1}, {0, 0}},   // one window of the whole plane
  };
  for (const Case& c : cases) {
    for (bool include_pad : {true, false}) {
      const std::string what = name("avg_pool2d x" + shape_str(c.x) +
                                    (include_pad ? " count_include_pad" : " exclude pad"));
      const CudnnCalls forward("cudnnPoolingForward"), backward("cudnnPoolingBackward");
      expect_matches_cpu(
          what, dtype(),
          [&](const V& v) { return avg_pool2d(v[0], c.kernel, c.stride, c.padding, include_pad); },
          {rnd(c.x)});
      forward.expect(pool_via_cudnn(), what);
      backward.expect(pool_via_cudnn(), what + " backward");
    }
  }
  // An empty batch: nothing for cuDNN, an empty output on both sides.
  const CudnnCalls forward("cudnnPoolingForward");
  expect_matches_cpu(name("avg_pool2d, empty batch"), dtype(),
                     [](const V& v) {
                       return avg_pool2d(v[0], {3, 3}, {2, 2}, {1, 1});
                     },
                     {rnd({0, 3, 9, 11})});
  forward.expect(false, name("avg_pool2d, empty batch"));
}

TEST_P(CudnnOps, MaxPoolingRoutesTiesToTheFirstMaximumWithoutCudnn) {
  // Few distinct values, so windows hold equal maxima; a NaN wins its windows.
  Tensor x = (rnd({2, 3, 8, 9}, 0.0, 3.0)).to(DType::i64).to(DType::f32);
  {
    std::vector<float> v = x.to_vector<float>();
    v[17] = std::numeric_limits<float>::quiet_NaN();
    x = from_vector<float>(v, x.shape());
  }
  const CudnnCalls forward("cudnnPoolingForward"), backward("cudnnPoolingBackward");
  for (const auto& [k, s, p] : std::vector<std::array<std::array<int64_t, 2>, 3>>{
           {{{3, 3}, {1, 1}, {1, 1}}}, {{{2, 2}, {2, 2}, {0, 0}}}, {{{3, 2}, {2, 1}, {1, 0}}}}) {
    expect_matches_cpu(name("max_pool2d with ties"), dtype(),
                       [&](const V& v) { return max_pool2d(v[0], k, s, p); }, {x});
  }
  expect_matches_cpu(name("max_pool2d, empty batch"), dtype(),
                     [](const V& v) {
                       return max_pool2d(v[0], {2, 2});
                     },
                     {rnd({0, 2, 4, 4})});
  // Global average pooling keeps its reduction kernel.
  expect_matches_cpu(name("adaptive_avg_pool2d"), dtype(),
                     [](const V& v) {
                       return adaptive_avg_pool2d(v[0], {1, 1});
                     },
                     {rnd({2, 3, 5, 7})});
  forward.expect(false, name("max and global pooling"));
  backward.expect(false, name("max and global pooling"));
}

INSTANTIATE_TEST_SUITE_P(DtypesAndPaths, CudnnOps,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f64, DType::f16,
                                                              DType::bf16),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_cudnn" : "_fallback");
                         });

}  // namespace
}  // namespace rg
