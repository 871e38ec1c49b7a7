// kernels/cuda/cast.cu under the CUDA emulator: fill in every type, and casts among f32, f64,
// f16 and bf16 bit-identical with kernels/cpu/cast on random bit patterns (NaN, inf, subnormals and
// rounding ties included); casts from integers on random bit patterns, and from floating types to
// integers on values where the conversion is defined.
#include "kernels/cuda/cast.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/cpu/cast.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

// n values of T from random bits (every class of value: NaN, inf, subnormal, normal), followed by
// hand-picked hard cases where they fit.
template <class T>
std::vector<T> random_bits(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) {
    const uint64_t bits = gen();
    std::memcpy(static_cast<void*>(&x), &bits, sizeof(T));
  }
  if constexpr (std::is_same_v<T, float>) {
    // Ties for f16 (1 + 2^-11, 1 + 3 * 2^-11) and bf16 (1 + 2^-8), the f16 overflow threshold,
    // f16 subnormals and a value that underflows to zero.
    const std::vector<float> hard = {
        1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, 1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f, 65504.f, 65520.f,
        65519.996f,     0x1p-24f,           0x1.8p-24f,    0x1p-26f,          -0.f,    3e38f};
    for (size_t i = 0; i < hard.size() && i < v.size(); ++i) v[i] = hard[i];
  }
  return v;
}

// The CPU's cast of the same input, then a bit comparison.
template <class From, class To>
void check_cast(const std::vector<From>& src) {
  const auto n = static_cast<int64_t>(src.size());
  std::vector<To> got(src.size()), want(src.size());
  cuda::cast(src.data(), got.data(), n, nullptr);
  cpu::cast(src.data(), want.data(), n);
  expect_bits_equal(got, want,
                    std::string("cast ") + type_name<From>() + " -> " + type_name<To>() +
                        " n=" + std::to_string(n));
}

template <class From, class To>
void check_cast(int64_t n) {
  check_cast<From, To>(random_bits<From>(n, 17 * n + sizeof(From) * 3 + sizeof(To)));
}

TEST(EmuFillCast, CastMatchesCpuBitForBit) {
  for (const int64_t n : kAwkwardSizes) {
    for_each_float_type(
        [n]<class From>() { for_each_float_type([n]<class To>() { check_cast<From, To>(n); }); });
  }
}

TEST(EmuFillCast, CastsFromIntegersMatchCpuBitForBit) {
  // Every bit pattern: integers convert to any type (narrowing integers wrap; large ones round,
  // or overflow f16 to inf).
  const auto to_every_type = [](int64_t n) {
    return [n]<class From>() {
      for_each_float_type([n]<class To>() { check_cast<From, To>(n); });
      for_each_integer_type([n]<class To>() { check_cast<From, To>(n); });
    };
  };
  for (const int64_t n : kAwkwardSizes) for_each_integer_type(to_every_type(n));
}

TEST(EmuFillCast, CastsToIntegersTruncateTowardZeroLikeTheCpu) {
  // Only values every integer type holds: outside its range a float-to-integer conversion is
  // undefined. The signed types also get negative values.
  for (const int64_t n : kAwkwardSizes) {
    for_each_float_type([n]<class From>() {
      const auto non_negative = random_values<From>(n, uint64_t(n) * 5 + sizeof(From), 0.f, 250.f);
      const auto signed_range =
          random_values<From>(n, uint64_t(n) * 7 + sizeof(From), -120.f, 120.f);
      for_each_integer_type([&]<class To>() { check_cast<From, To>(non_negative); });
      check_cast<From, int64_t>(signed_range);
      check_cast<From, int32_t>(signed_range);
    });
  }
  // Into u8 through int64, as PyTorch: negative and large values wrap (the same on the CPU).
  for_each_float_type([]<class From>() {
    // Values every floating type holds well enough: f16/bf16 round 300.75 and 200.5 to 300.75 or
    // 300 and 200.5 or 200, which truncate alike.
    const std::vector<float> v = {-1.f, -2.5f, 300.75f, 200.5f, -256.f, 1000.f};
    std::vector<From> src(v.size());
    for (size_t i = 0; i < v.size(); ++i) src[i] = cpu::convert<From>(v[i]);
    check_cast<From, uint8_t>(src);
    std::vector<uint8_t> got(v.size());
    cuda::cast(src.data(), got.data(), int64_t(v.size()), nullptr);
    EXPECT_EQ(got, (std::vector<uint8_t>{255, 254, 44, 200, 0, 232})) << type_name<From>();
  });
  // Truncation, not rounding: -2.7 -> -2, 2.7 -> 2, 0.5 -> 0.
  const std::vector<float> x = {-2.7f, 2.7f, 0.5f, -0.5f, 1e9f};
  std::vector<int64_t> y(x.size());
  cuda::cast(x.data(), y.data(), int64_t(x.size()), nullptr);
  EXPECT_EQ(y, (std::vector<int64_t>{-2, 2, 0, 0, 1000000000}));
}

TEST(EmuFillCast, CastRoundsToNearestEven) {
  const std::vector<float> x = {1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, 65520.f, 0x1p-25f};
  std::vector<Half> h(x.size());
  cuda::cast(x.data(), h.data(), int64_t(x.size()), nullptr);
  EXPECT_EQ(h[0].bits, 0x3c00);  // tie -> even (1.0)
  EXPECT_EQ(h[1].bits, 0x3c02);  // tie -> even (1 + 2^-9)
  EXPECT_EQ(h[2].bits, 0x7c00);  // rounds up to inf
  EXPECT_EQ(h[3].bits, 0x0000);  // half the smallest subnormal: tie -> even (0)
  const std::vector<float> y = {1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f};
  std::vector<BFloat16> b(y.size());
  cuda::cast(y.data(), b.data(), int64_t(y.size()), nullptr);
  EXPECT_EQ(b[0].bits, 0x3f80);
  EXPECT_EQ(b[1].bits, 0x3f82);
}

template <class T>
void check_fill(T value, const std::string& what) {
  for (const int64_t n : kAwkwardSizes) {
    // One sentinel past the end must stay untouched.
    std::vector<T> out(static_cast<size_t>(n) + 1);
    const T sentinel = cpu::convert<T>(7);
    out.back() = sentinel;
    cuda::fill(out.data(), value, n, nullptr);
    std::vector<T> want(static_cast<size_t>(n) + 1, value);
    want.back() = sentinel;
    expect_bits_equal(out, want, what + " n=" + std::to_string(n));
  }
}

TEST(EmuFillCast, FillEveryType) {
  check_fill<float>(-2.5f, "f32");
  check_fill<double>(1e300, "f64");
  check_fill<Half>(Half{0x7e00}, "f16 nan");  // any bit pattern passes unchanged
  check_fill<BFloat16>(BFloat16{0xbf80}, "bf16 -1");
  check_fill<int64_t>(int64_t{1} << 40, "i64");
  check_fill<int32_t>(-3, "i32");
  check_fill<uint8_t>(255, "u8");
}

TEST(EmuFillCast, ZeroSizeDoesNothing) {
  std::vector<float> out = {42.f};
  const std::vector<Half> src = {Half{0x3c00}};
  cuda::fill(out.data(), 1.f, 0, nullptr);
  cuda::cast(src.data(), out.data(), 0, nullptr);
  EXPECT_EQ(out[0], 42.f);
  EXPECT_THROW(cuda::fill(out.data(), 1.f, -1, nullptr), rg::Error);
  EXPECT_THROW(cuda::cast(src.data(), out.data(), -5, nullptr), rg::Error);
}

}  // namespace
}  // namespace rg::emu_kernel_test
