// Helpers for the device tests (tests/device): run an op on the CPU and on cuda:0 from the same
// inputs, forward and backward, and compare. Built into rg_emu_engine_tests (the emulated device
// of rg_engine_emu) and rg_gpu_device_tests (a real GPU); without a device every test skips.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/cuda/runtime.h"
#include "engine/generator.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/reduce.h"
#include "engine/tensor.h"
#include "engine/tf32.h"

namespace rg::testing {

inline const Device kCuda = Device::cuda(0);

// Skips the test when there is no CUDA device (real or emulated) to run on.
#define RG_REQUIRE_DEVICE()                                                                       \
  do {                                                                                            \
    if (::rg::cuda::runtime().device_count() == 0) {                                              \
      GTEST_SKIP() << "no CUDA device: " << ::rg::cuda::runtime().backend().unavailable_reason(); \
    }                                                                                             \
  } while (0)

// Every element of `actual` (any device, any dtype) within atol + rtol * |expected| of `expected`.
inline void expect_close(const Tensor& actual, const Tensor& expected, double atol, double rtol,
                         const std::string& what = "") {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  int reported = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(e[i]);
    const bool equal = a[i] == e[i];  // also infinities of one sign
    if (!both_nan && !equal && !(std::abs(a[i] - e[i]) <= atol + rtol * std::abs(e[i]))) {
      ADD_FAILURE() << what << ": element " << i << " is " << a[i] << ", expected " << e[i];
      if (++reported == 5) return;
    }
  }
}

// ||actual - truth|| / ||truth|| over all elements, in f64 (||actual - truth|| when truth is 0):
// the normwise error, for results whose elements round too differently to compare one by one.
inline double relative_error(const Tensor& actual, const Tensor& truth) {
  const std::vector<double> a = actual.to_vector<double>(), t = truth.to_vector<double>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    diff += (a[i] - t[i]) * (a[i] - t[i]);
    norm += t[i] * t[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

// Tolerances for comparing the CUDA path with the CPU one: summation orders differ.
struct Tolerance {
  double atol, rtol;
};
inline Tolerance tolerance_for(DType t) {
  switch (t) {
    case DType::f64:
      return {1e-10, 1e-9};
    case DType::f16:
      return {2e-3, 2e-3};
    case DType::bf16:
      return {1e-2, 1e-2};
    default:
      return {2e-5, 2e-4};
  }
}

// f32 on CUDA with TF32 allowed (engine/tf32.h) against the CPU's f32: each product's inputs lose
// 13 of their 23 mantissa bits (relative rounding up to 2^-11 each), so sums of products carry
// errors of about 1e-3 of their terms' magnitude; PyTorch's own TF32 tests use 5e-3 to 1e-2.
inline constexpr Tolerance kTf32Tolerance{1e-2, 1e-2};

// Random inputs: uniform in [low, high), f32 or f64, on the CPU.
inline Tensor random_tensor(const Shape& shape, Generator& gen, DType dtype = DType::f32,
                            double low = -1.0, double high = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  return uniform_(t, low, high, gen);
}

using DeviceFn = std::function<Tensor(const std::vector<Tensor>&)>;

struct DeviceResult {
  Tensor out;
  std::vector<Tensor> grads;  // of each input (undefined when it got none)
};

// Runs f on copies of `inputs` on `device` as leaves requiring grad (floating inputs), then,
// when `upstream` is defined, backward of sum(out * upstream).
inline DeviceResult run_on(Device device, const DeviceFn& f, const std::vector<Tensor>& inputs,
                           const Tensor& upstream) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) {
    Tensor leaf = t.detach().clone().to(device).detach();
    if (upstream.defined() && is_floating(t.dtype())) leaf.set_requires_grad(true);
    leaves.push_back(leaf);
  }
  DeviceResult r;
  r.out = f(leaves);
  if (upstream.defined()) {
    sum(mul(r.out, upstream.to(device))).backward();
    for (const Tensor& leaf : leaves)
      r.grads.push_back(leaf.requires_grad() ? leaf.grad() : Tensor());
  }
  return r;
}

// f on the CPU and on cuda:0 from the same inputs; the outputs and, with backward, every input's
// gradient agree within the tolerance of the inputs' dtype (or `tol`).
inline void expect_same_on_device(const std::string& what, const DeviceFn& f,
                                  const std::vector<Tensor>& inputs, bool backward = true,
                                  const Tolerance* tol = nullptr) {
  Generator gen(1234);
  Tensor upstream;
  if (backward) {
    const DeviceResult probe = run_on(Device::cpu(), f, inputs, Tensor());
    upstream = random_tensor(probe.out.shape(), gen, probe.out.dtype());
  }
  const DeviceResult cpu = run_on(Device::cpu(), f, inputs, upstream);
  const DeviceResult dev = run_on(kCuda, f, inputs, upstream);
  ASSERT_TRUE(dev.out.device().is_cuda())
      << what << ": the output is on " << dev.out.device().str();
  const Tolerance t = tol != nullptr ? *tol : tolerance_for(inputs.front().dtype());
  expect_close(dev.out, cpu.out, t.atol, t.rtol, what + " forward");
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    ASSERT_EQ(dev.grads[i].defined(), cpu.grads[i].defined()) << what << " grad " << i;
    if (!cpu.grads[i].defined()) continue;
    EXPECT_TRUE(dev.grads[i].device().is_cuda()) << what << " grad " << i;
    expect_close(dev.grads[i], cpu.grads[i], t.atol, t.rtol,
                 what + " grad of input " + std::to_string(i));
  }
}

}  // namespace rg::testing
