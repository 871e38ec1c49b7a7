// kernels/dropout.h: Dropout<Cuda> (kernels/cuda/dropout.cu under the CUDA emulator) against
// Dropout<Cpu>: the Philox mask bit for bit for the same seed and offset (every type, awkward
// sizes, offsets past 2^32), and the fused forward and the backward multiply by it.
#include "kernels/dropout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

using Cpu = kernels::Dropout<kernels::Cpu>;
using Cuda = kernels::Dropout<kernels::Cuda>;

constexpr uint64_t kSeeds[] = {0, 1234, 0xDEADBEEFCAFEF00Dull};
constexpr uint64_t kOffsets[] = {0, 5, (uint64_t{1} << 33) + 7};
constexpr double kProbabilities[] = {0.0, 0.1, 0.5, 0.75, 1.0};

double scale_for(double p) { return p < 1.0 ? 1.0 / (1.0 - p) : 0.0; }

// The CPU mask in T: computed in f32 for f16/bf16 (its values are 0 and the scale, exact).
template <class T>
std::vector<T> cpu_mask(int64_t n, double p, uint64_t seed, uint64_t offset) {
  std::vector<ref_t<T>> m(static_cast<size_t>(n));
  Cpu::mask<ref_t<T>>(m.data(), n, p, ref_t<T>(scale_for(p)), seed, offset, {});
  return narrow<T>(m);
}

template <class T>
T scale_as(double p) {
  return kernels::cpu::convert<T>(ref_t<T>(scale_for(p)));
}

TEST(EmuDropout, MaskMatchesCpuBitForBit) {
  for_each_float_type([]<class T>() {
    for (const uint64_t seed : kSeeds) {
      for (const uint64_t offset : kOffsets) {
        for (const double p : kProbabilities) {
          for (const int64_t n : kAwkwardSizes) {
            std::vector<T> got(static_cast<size_t>(n));
            Cuda::mask(got.data(), n, p, scale_as<T>(p), seed, offset, {});
            expect_bits_equal(
                got, cpu_mask<T>(n, p, seed, offset),
                label<T>("mask p=" + std::to_string(p) + " seed " + std::to_string(seed) +
                             " offset " + std::to_string(offset),
                         n));
          }
        }
      }
    }
  });
}

TEST(EmuDropout, ForwardAndBackwardMatchCpu) {
  for_each_float_type([]<class T>() {
    for (const double p : {0.2, 0.5}) {
      for (const int64_t n : kAwkwardSizes) {
        const uint64_t seed = 77, offset = 3 * uint64_t(n);
        const auto x = random_values<T>(n, 40 + n);
        const auto grad = random_values<T>(n, 50 + n);
        std::vector<T> out(static_cast<size_t>(n)), mask(static_cast<size_t>(n)),
            grad_in(static_cast<size_t>(n));
        Cuda::forward(x.data(), out.data(), mask.data(), n, p, scale_as<T>(p), seed, offset, {});
        Cuda::backward(grad.data(), mask.data(), grad_in.data(), n, {});

        // The CPU op: mask, then x * mask (and grad * mask), each product rounded once.
        const auto want_mask = cpu_mask<T>(n, p, seed, offset);
        const auto wm = widen(want_mask), wx = widen(x), wg = widen(grad);
        std::vector<ref_t<T>> want_out(static_cast<size_t>(n)), want_grad(static_cast<size_t>(n));
        for (size_t i = 0; i < want_out.size(); ++i) {
          want_out[i] = wx[i] * wm[i];
          want_grad[i] = wg[i] * wm[i];
        }
        const std::string what = label<T>("dropout p=" + std::to_string(p), n);
        expect_bits_equal(mask, want_mask, what + " mask");
        expect_bits_equal(out, narrow<T>(want_out), what + " forward");
        expect_bits_equal(grad_in, narrow<T>(want_grad), what + " backward");
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          // The CPU kernels with the same arguments: the same bits.
          std::vector<T> cpu_out(out.size()), cpu_mask_(mask.size()), cpu_grad(grad_in.size());
          Cpu::forward(x.data(), cpu_out.data(), cpu_mask_.data(), n, p, scale_as<T>(p), seed,
                       offset, {});
          Cpu::backward(grad.data(), cpu_mask_.data(), cpu_grad.data(), n, {});
          expect_bits_equal(cpu_mask_, mask, what + " CPU mask");
          expect_bits_equal(cpu_out, out, what + " CPU forward");
          expect_bits_equal(cpu_grad, grad_in, what + " CPU backward");
        }
      }
    }
  });
}

TEST(EmuDropout, KeepsAboutOneMinusP) {
  const int64_t n = 1 << 18;
  std::vector<float> mask(static_cast<size_t>(n));
  Cuda::mask(mask.data(), n, 0.3, 1.f, 42, 0, {});
  int64_t kept = 0;
  for (const float m : mask) kept += m != 0.f;
  EXPECT_NEAR(double(kept) / double(n), 0.7, 0.005);
}

TEST(EmuDropout, ConsecutiveOffsetsContinueOneStream) {
  // Two calls whose offsets advance by (n + 3) / 4 give the mask of one call over both, when n is
  // a multiple of 4 (the engine reserves whole counters per call).
  const int64_t n = 1000;
  std::vector<float> both(2 * n), first(n), second(n);
  Cuda::mask(both.data(), 2 * n, 0.5, 2.f, 9, 100, {});
  Cuda::mask(first.data(), n, 0.5, 2.f, 9, 100, {});
  Cuda::mask(second.data(), n, 0.5, 2.f, 9, 100 + (n + 3) / 4, {});
  first.insert(first.end(), second.begin(), second.end());
  expect_bits_equal(first, both, "split mask");
}

TEST(EmuDropout, ZeroSizeDoesNothingAndBadArgumentsThrow) {
  std::vector<float> x = {1.f}, out = {42.f}, mask = {42.f};
  Cuda::forward(x.data(), out.data(), mask.data(), 0, 0.5, 2.f, 1, 0, {});
  Cuda::mask(mask.data(), 0, 0.5, 2.f, 1, 0, {});
  Cuda::backward(x.data(), x.data(), out.data(), 0, {});
  EXPECT_EQ(out[0], 42.f);
  EXPECT_EQ(mask[0], 42.f);
  EXPECT_THROW(Cuda::mask(mask.data(), 1, 1.5, 2.f, 1, 0, {}), rg::Error);
  EXPECT_THROW(Cuda::mask(mask.data(), 1, -0.1, 2.f, 1, 0, {}), rg::Error);
  EXPECT_THROW(Cuda::mask(mask.data(), -1, 0.5, 2.f, 1, 0, {}), rg::Error);
  EXPECT_THROW(Cpu::mask(mask.data(), 1, 1.5, 2.f, 1, 0, {}), rg::Error);
  EXPECT_THROW(Cpu::mask(mask.data(), -1, 0.5, 2.f, 1, 0, {}), rg::Error);
}

}  // namespace
}  // namespace rg::emu_kernel_test
