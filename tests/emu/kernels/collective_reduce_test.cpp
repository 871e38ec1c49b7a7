// kernels/cuda/collective_reduce.cu under the CUDA emulator against kernels/cpu/collective_reduce:
// sum/max/min and divide_by in every storage type, compared bit for bit (both sides compute the
// same operation in the same type and round once).
#include "kernels/cuda/collective_reduce.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/cpu/collective_reduce.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

constexpr std::array kOps = {cpu::CollectiveOp::sum, cpu::CollectiveOp::max,
                             cpu::CollectiveOp::min};

// Random values of T; floating types get a NaN and infinities at fixed places (x[0], x[3], x[5]).
template <class T>
std::vector<T> values(int64_t n, uint64_t seed, bool specials) {
  if constexpr (std::is_integral_v<T>) {
    std::mt19937_64 gen(seed);
    std::uniform_int_distribution<int> dist(std::is_signed_v<T> ? -1000 : 0, 255);
    std::vector<T> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<T>(dist(gen));
    return v;
  } else {
    auto v = random_values<T>(n, seed, -100.f, 100.f);
    if (specials) {
      const float inf = std::numeric_limits<float>::infinity();
      if (n > 0) v[0] = cpu::convert<T>(std::numeric_limits<float>::quiet_NaN());
      if (n > 3) v[3] = cpu::convert<T>(inf);
      if (n > 5) v[5] = cpu::convert<T>(-inf);
    }
    return v;
  }
}

// Calls f.template operator()<T>() for every storage type of the collectives.
template <class F>
void for_each_collective_type(F&& f) {
  for_each_float_type(f);
  const auto one = [&]<class T>(const char* name) {
    SCOPED_TRACE(name);
    f.template operator()<T>();
  };
  one.template operator()<int64_t>("i64");
  one.template operator()<int32_t>("i32");
  one.template operator()<uint8_t>("u8");
}

std::string op_name(cpu::CollectiveOp op) {
  switch (op) {
    case cpu::CollectiveOp::sum:
      return "sum";
    case cpu::CollectiveOp::max:
      return "max";
    case cpu::CollectiveOp::min:
      return "min";
  }
  return "?";
}

TEST(EmuCollectiveReduce, SumMaxMinMatchCpu) {
  for_each_collective_type([]<class T>() {
    for (const auto op : kOps) {
      for (const int64_t n : kAwkwardSizes) {
        // NaN/inf in a at 0, 3, 5 and in b elsewhere (b is shifted by one): both orders matter
        // for max/min.
        const auto a = values<T>(n, 10 + n, true);
        auto b = values<T>(n, 20 + n, false);
        if constexpr (!std::is_integral_v<T>) {
          if (n > 1) b[1] = cpu::convert<T>(std::numeric_limits<float>::quiet_NaN());
          if (n > 4) b[4] = cpu::convert<T>(std::numeric_limits<float>::infinity());
        }
        std::vector<T> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
        cuda::collective_reduce(op, got.data(), a.data(), b.data(), n, nullptr);
        cpu::collective_reduce(op, want.data(), a.data(), b.data(), n);
        expect_bits_equal(got, want, op_name(op) + " n=" + std::to_string(n));
      }
    }
  });
}

TEST(EmuCollectiveReduce, OutputMayAliasAnInput) {
  for_each_collective_type([]<class T>() {
    for (const auto op : kOps) {
      const int64_t n = 1000;
      const auto a = values<T>(n, 1, false), b = values<T>(n, 2, false);
      std::vector<T> want(static_cast<size_t>(n));
      cpu::collective_reduce(op, want.data(), a.data(), b.data(), n);
      auto in_a = a;
      cuda::collective_reduce(op, in_a.data(), in_a.data(), b.data(), n, nullptr);
      expect_bits_equal(in_a, want, op_name(op) + " into a");
      auto in_b = b;
      cuda::collective_reduce(op, in_b.data(), a.data(), in_b.data(), n, nullptr);
      expect_bits_equal(in_b, want, op_name(op) + " into b");
    }
  });
}

TEST(EmuCollectiveReduce, DivideByMatchesCpu) {
  for_each_collective_type([]<class T>() {
    for (const int64_t divisor : {1, 2, 3, 7}) {
      for (const int64_t n : kAwkwardSizes) {
        auto got = values<T>(n, 30 + n, true);
        auto want = got;
        cuda::divide_by(got.data(), n, divisor, nullptr);
        cpu::divide_by(want.data(), n, divisor);
        expect_bits_equal(got, want,
                          "divide_by " + std::to_string(divisor) + " n=" + std::to_string(n));
      }
    }
  });
}

TEST(EmuCollectiveReduce, ZeroSizeDoesNothingAndBadArgumentsThrow) {
  std::vector<float> x = {42.f}, y = {1.f};
  cuda::collective_reduce(cpu::CollectiveOp::sum, x.data(), x.data(), y.data(), 0, nullptr);
  cuda::divide_by(x.data(), 0, 3, nullptr);
  EXPECT_EQ(x[0], 42.f);
  EXPECT_THROW(
      cuda::collective_reduce(cpu::CollectiveOp::sum, x.data(), x.data(), y.data(), -1, nullptr),
      rg::Error);
  EXPECT_THROW(cuda::divide_by(x.data(), 1, 0, nullptr), rg::Error);
  EXPECT_THROW(cuda::divide_by(x.data(), -1, 2, nullptr), rg::Error);
}

}  // namespace
}  // namespace rg::emu_kernel_test
