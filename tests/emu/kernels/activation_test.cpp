// kernels/activation.h: Activation<Cuda> (kernels/cuda/activation.cu under the CUDA emulator)
// against Activation<Cpu> on the same arguments: relu, leaky_relu, gelu (exact and tanh), sigmoid
// and tanh, forward and backward, in f32, f64, f16 and bf16 on the awkward sizes; special values
// bit for bit, and the shared size check.
#include "kernels/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

using cuda = kernels::Activation<kernels::Cuda>;
using cpu = kernels::Activation<kernels::Cpu>;

constexpr double kAtol = 1e-6;

// Runs a forward: gpu(x, out, n) against cpu(widened x, out, n), inputs in [-3, 3).
template <class T, class Gpu, class Cpu>
void check_forward(const std::string& what, Gpu&& gpu, Cpu&& cpu_fn) {
  for (const int64_t n : kAwkwardSizes) {
    const auto x = random_values<T>(n, 1000 + n, -3.f, 3.f);
    std::vector<T> got(static_cast<size_t>(n));
    gpu(x.data(), got.data(), n);
    std::vector<ref_t<T>> want(static_cast<size_t>(n));
    cpu_fn(widen(x).data(), want.data(), n);
    expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(), label<T>(what, n));
  }
}

// Runs a backward: gpu(grad, saved, grad_in, n) against the CPU's; `saved` is the forward's input
// or, with from_output, its output (computed by the CPU forward and rounded to T).
template <class T, class Gpu, class Cpu, class CpuForward>
void check_backward(const std::string& what, Gpu&& gpu, Cpu&& cpu_fn, CpuForward&& forward) {
  for (const int64_t n : kAwkwardSizes) {
    const auto x = random_values<T>(n, 2000 + n, -3.f, 3.f);
    const auto grad = random_values<T>(n, 3000 + n);
    std::vector<ref_t<T>> saved_ref(static_cast<size_t>(n));
    forward(widen(x).data(), saved_ref.data(), n);
    const std::vector<T> saved = narrow<T>(saved_ref);
    std::vector<T> got(static_cast<size_t>(n));
    gpu(grad.data(), saved.data(), got.data(), n);
    std::vector<ref_t<T>> want(static_cast<size_t>(n));
    cpu_fn(widen(grad).data(), widen(saved).data(), want.data(), n);
    expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(), label<T>(what, n));
  }
}

// The identity as a "forward", for backwards that take the forward's input.
template <class R>
void copy_input(const R* x, R* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i];
}

TEST(EmuActivation, ReluMatchesCpu) {
  for_each_float_type([]<class T>() {
    using R = ref_t<T>;
    check_forward<T>(
        "relu", [](const T* x, T* o, int64_t n) { cuda::relu(x, o, n, {}); },
        [](const R* x, R* o, int64_t n) { cpu::relu(x, o, n, {}); });
    check_backward<T>(
        "relu_backward",
        [](const T* g, const T* y, T* gi, int64_t n) { cuda::relu_backward(g, y, gi, n, {}); },
        [](const R* g, const R* y, R* gi, int64_t n) { cpu::relu_backward(g, y, gi, n, {}); },
        [](const R* x, R* o, int64_t n) { cpu::relu(x, o, n, {}); });
  });
}

TEST(EmuActivation, LeakyReluMatchesCpu) {
  for_each_float_type([]<class T>() {
    using R = ref_t<T>;
    for (const double slope : {0.01, -0.3}) {
      check_forward<T>(
          "leaky_relu", [&](const T* x, T* o, int64_t n) { cuda::leaky_relu(x, o, n, slope, {}); },
          [&](const R* x, R* o, int64_t n) { cpu::leaky_relu(x, o, n, slope, {}); });
      check_backward<T>(
          "leaky_relu_backward",
          [&](const T* g, const T* x, T* gi, int64_t n) {
            cuda::leaky_relu_backward(g, x, gi, n, slope, {});
          },
          [&](const R* g, const R* x, R* gi, int64_t n) {
            cpu::leaky_relu_backward(g, x, gi, n, slope, {});
          },
          copy_input<R>);
    }
  });
}

TEST(EmuActivation, GeluMatchesCpu) {
  for_each_float_type([]<class T>() {
    using R = ref_t<T>;
    for (const bool approximate : {false, true}) {
      const std::string tag = approximate ? " tanh" : " exact";
      check_forward<T>(
          "gelu" + tag, [&](const T* x, T* o, int64_t n) { cuda::gelu(x, o, n, approximate, {}); },
          [&](const R* x, R* o, int64_t n) { cpu::gelu(x, o, n, approximate, {}); });
      check_backward<T>(
          "gelu_backward" + tag,
          [&](const T* g, const T* x, T* gi, int64_t n) {
            cuda::gelu_backward(g, x, gi, n, approximate, {});
          },
          [&](const R* g, const R* x, R* gi, int64_t n) {
            cpu::gelu_backward(g, x, gi, n, approximate, {});
          },
          copy_input<R>);
    }
  });
}

TEST(EmuActivation, SigmoidMatchesCpu) {
  for_each_float_type([]<class T>() {
    using R = ref_t<T>;
    check_forward<T>(
        "sigmoid", [](const T* x, T* o, int64_t n) { cuda::sigmoid(x, o, n, {}); },
        [](const R* x, R* o, int64_t n) { cpu::sigmoid(x, o, n, {}); });
    check_backward<T>(
        "sigmoid_backward",
        [](const T* g, const T* y, T* gi, int64_t n) { cuda::sigmoid_backward(g, y, gi, n, {}); },
        [](const R* g, const R* y, R* gi, int64_t n) { cpu::sigmoid_backward(g, y, gi, n, {}); },
        [](const R* x, R* o, int64_t n) { cpu::sigmoid(x, o, n, {}); });
  });
}

TEST(EmuActivation, TanhMatchesCpu) {
  for_each_float_type([]<class T>() {
    using R = ref_t<T>;
    check_forward<T>(
        "tanh", [](const T* x, T* o, int64_t n) { cuda::tanh(x, o, n, {}); },
        [](const R* x, R* o, int64_t n) { cpu::tanh(x, o, n, {}); });
    check_backward<T>(
        "tanh_backward",
        [](const T* g, const T* y, T* gi, int64_t n) { cuda::tanh_backward(g, y, gi, n, {}); },
        [](const R* g, const R* y, R* gi, int64_t n) { cpu::tanh_backward(g, y, gi, n, {}); },
        [](const R* x, R* o, int64_t n) { cpu::tanh(x, o, n, {}); });
  });
}

TEST(EmuActivation, SpecialValuesMatchCpu) {
  // NaN stays NaN through relu (like PyTorch); saturation at +-inf. Compared bit for bit, since
  // expect_close cannot match an infinity.
  const std::vector<float> x = {NAN, INFINITY, -INFINITY, 0.f, -0.f, -100.f, 100.f};
  const int64_t n = int64_t(x.size());
  std::vector<float> got(x.size()), want(x.size());
  cuda::relu(x.data(), got.data(), n, {});
  cpu::relu(x.data(), want.data(), n, {});
  expect_bits_equal(got, want, "relu special values");
  EXPECT_TRUE(std::isnan(got[0]));
  cuda::sigmoid(x.data(), got.data(), n, {});
  cpu::sigmoid(x.data(), want.data(), n, {});
  expect_bits_equal(got, want, "sigmoid special values");
  cuda::tanh(x.data(), got.data(), n, {});
  cpu::tanh(x.data(), want.data(), n, {});
  expect_bits_equal(got, want, "tanh special values");
  cuda::gelu(x.data(), got.data(), n, false, {});
  EXPECT_TRUE(std::isnan(got[0]));
  EXPECT_EQ(got[1], INFINITY);
  EXPECT_EQ(got[6], 100.f);
}

// leaky_relu is exact: x * (x > 0 ? 1 : slope) on both backends, so the results agree bit for
// bit, signed zeros included (max(x, 0) + slope * min(x, 0), which the CPU computed, gives +0
// where x * slope is -0: slope 0 and negative x, or a negative slope and x = +0).
template <class T>
void check_leaky_relu_bits() {
  const T nan = std::numeric_limits<T>::quiet_NaN(), inf = std::numeric_limits<T>::infinity();
  const std::vector<T> x = {nan, -nan, T(0), -T(0), inf, -inf, T(-1), T(1), T(-1e-30), T(3)};
  const std::vector<T> grad = {T(1), T(-2), T(3), T(-4), T(5), T(-6), T(7), T(-8), T(9), T(0)};
  const int64_t n = int64_t(x.size());
  for (const double slope : {0.0, 0.01, -0.5, 1.0}) {
    const std::string what = ::rg::detail::cat(type_name<T>(), " slope ", slope);
    std::vector<T> got(x.size()), want(x.size());
    cuda::leaky_relu(x.data(), got.data(), n, slope, {});
    cpu::leaky_relu(x.data(), want.data(), n, slope, {});
    expect_bits_equal(got, want, "leaky_relu special values " + what);
    for (size_t i = 0; i < x.size(); ++i) {
      const T expected = x[i] * (x[i] > T(0) ? T(1) : T(slope));
      EXPECT_EQ(std::memcmp(&got[i], &expected, sizeof(T)), 0)
          << what << ": leaky_relu(" << x[i] << ") is " << got[i] << ", expected " << expected;
    }
    cuda::leaky_relu_backward(grad.data(), x.data(), got.data(), n, slope, {});
    cpu::leaky_relu_backward(grad.data(), x.data(), want.data(), n, slope, {});
    expect_bits_equal(got, want, "leaky_relu_backward special values " + what);
  }
}

TEST(EmuActivation, LeakyReluIsBitwiseEqualWithSignedZerosAndNan) {
  check_leaky_relu_bits<float>();
  check_leaky_relu_bits<double>();
}

TEST(EmuActivation, ZeroSizeDoesNothing) {
  std::vector<float> x = {1.f}, out = {42.f};
  cuda::relu(x.data(), out.data(), 0, {});
  cuda::gelu(x.data(), out.data(), 0, true, {});
  cuda::sigmoid_backward(x.data(), x.data(), out.data(), 0, {});
  cuda::leaky_relu_backward(x.data(), x.data(), out.data(), 0, 0.1, {});
  EXPECT_EQ(out[0], 42.f);
  EXPECT_THROW(cuda::tanh(x.data(), out.data(), -1, {}), rg::Error);
  // The CPU kernels make the same check (they used to take any count).
  cpu::relu(x.data(), out.data(), 0, {});
  cpu::gelu_backward(x.data(), x.data(), out.data(), 0, false, {});
  EXPECT_EQ(out[0], 42.f);
  EXPECT_THROW(cpu::tanh(x.data(), out.data(), -1, {}), rg::Error);
  EXPECT_THROW(cpu::leaky_relu(x.data(), out.data(), -1, 0.1, {}), rg::Error);
  EXPECT_THROW(cuda::leaky_relu(x.data(), out.data(), -1, 0.1, {}), rg::Error);
}

}  // namespace
}  // namespace rg::emu_kernel_test
