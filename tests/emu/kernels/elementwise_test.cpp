// kernels/cuda/elementwise.cu under the CUDA emulator against kernels/cpu/unary and binary: every
// op, awkward sizes and broadcast shapes, in f32, f64, f16 and bf16.
#include "kernels/cuda/elementwise.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/cpu/binary.h"
#include "kernels/cpu/unary.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

constexpr std::array kUnaryOps = {cpu::UnaryOp::neg, cpu::UnaryOp::exp, cpu::UnaryOp::log,
                                  cpu::UnaryOp::sqrt};
constexpr std::array kBinaryOps = {cpu::BinaryOp::add, cpu::BinaryOp::sub, cpu::BinaryOp::mul,
                                   cpu::BinaryOp::div};
constexpr double kAtol = 1e-6;

std::string op_name(cpu::UnaryOp op) { return "unary op " + std::to_string(int(op)); }
std::string op_name(cpu::BinaryOp op) { return "binary op " + std::to_string(int(op)); }

// Second operands stay away from zero so that div is well conditioned in f16.
template <class T>
std::vector<T> divisor_values(int64_t n, uint64_t seed) {
  std::vector<T> v = random_values<T>(n, seed, 0.25f, 2.f);
  for (size_t i = 0; i < v.size(); i += 2) v[i] = kernels::cpu::convert<T>(-as_double(v[i]));
  return v;
}

TEST(EmuElementwise, UnaryMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto op : kUnaryOps) {
      for (const int64_t n : kAwkwardSizes) {
        const bool positive = op == cpu::UnaryOp::log || op == cpu::UnaryOp::sqrt;
        const auto x = random_values<T>(n, 100 + n, positive ? 0.05f : -2.f, 2.f);
        std::vector<T> got(static_cast<size_t>(n));
        cuda::unary(op, x.data(), got.data(), n, nullptr);
        std::vector<ref_t<T>> want(static_cast<size_t>(n));
        cpu::unary(op, widen(x).data(), want.data(), n);
        expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(), label<T>(op_name(op), n));
      }
    }
  });
}

TEST(EmuElementwise, PowScalarMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const double p : {2.0, 1.0, 0.5, 3.0, -1.5}) {
      for (const int64_t n : kAwkwardSizes) {
        const auto x = random_values<T>(n, 200 + n, 0.1f, 2.f);
        std::vector<T> got(static_cast<size_t>(n));
        cuda::pow_scalar(x.data(), p, got.data(), n, nullptr);
        std::vector<ref_t<T>> want(static_cast<size_t>(n));
        cpu::pow_scalar(widen(x).data(), ref_t<T>(p), want.data(), n);
        expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(),
                     label<T>("pow " + std::to_string(p), n));
      }
    }
  });
}

TEST(EmuElementwise, BinarySameShapeMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto op : kBinaryOps) {
      for (const int64_t n : kAwkwardSizes) {
        const auto a = random_values<T>(n, 300 + n);
        const auto b = divisor_values<T>(n, 400 + n);
        std::vector<T> got(static_cast<size_t>(n));
        cuda::binary(op, a.data(), b.data(), got.data(), n, nullptr);
        std::vector<ref_t<T>> want(static_cast<size_t>(n));
        cpu::binary(op, widen(a).data(), widen(b).data(), want.data(), n);
        expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(), label<T>(op_name(op), n));
      }
    }
  });
}

TEST(EmuElementwise, BinaryInPlaceMatchesCpu) {
  // out aliasing an input (a += b) is how the engine accumulates gradients.
  for_each_float_type([]<class T>() {
    const int64_t n = 4097;
    auto a = random_values<T>(n, 7);
    const auto b = random_values<T>(n, 8);
    std::vector<ref_t<T>> want(static_cast<size_t>(n));
    cpu::binary(cpu::BinaryOp::add, widen(a).data(), widen(b).data(), want.data(), n);
    cuda::binary(cpu::BinaryOp::add, a.data(), b.data(), a.data(), n, nullptr);
    expect_close(a, narrow<T>(want), kAtol, default_rtol<T>(), label<T>("in place add", n));
  });
}

TEST(EmuElementwise, BinaryScalarMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto op : kBinaryOps) {
      for (const bool scalar_first : {false, true}) {
        for (const int64_t n : kAwkwardSizes) {
          const double s = -1.7;
          const auto a = divisor_values<T>(n, 500 + n);
          std::vector<T> got(static_cast<size_t>(n));
          cuda::binary_scalar(op, a.data(), s, got.data(), n, scalar_first, nullptr);
          std::vector<ref_t<T>> want(static_cast<size_t>(n));
          cpu::binary_scalar(op, widen(a).data(), ref_t<T>(s), want.data(), n, scalar_first);
          expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(),
                       label<T>(op_name(op) + (scalar_first ? " scalar first" : ""), n));
        }
      }
    }
  });
}

// [N, C, H, W] shapes: the awkward element counts, plus one with every dimension > 1.
constexpr std::array<std::array<int64_t, 4>, 6> kNchwShapes = {
    {{1, 1, 1, 1}, {1, 31, 1, 1}, {1, 3, 11, 1}, {2, 5, 10, 10}, {1, 17, 241, 1}, {3, 7, 5, 9}}};

TEST(EmuElementwise, BinaryPerChannelMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto op : kBinaryOps) {
      for (const bool b_first : {false, true}) {
        for (const auto& s : kNchwShapes) {
          const int64_t n = s[0] * s[1] * s[2] * s[3], inner = s[2] * s[3];
          const auto a = divisor_values<T>(n, 600 + n);
          const auto b = divisor_values<T>(s[1], 700 + s[1]);
          std::vector<T> got(static_cast<size_t>(n));
          cuda::binary_per_channel(op, a.data(), b.data(), got.data(), s[0], s[1], inner, b_first,
                                   nullptr);
          const int64_t a_strides[4] = {s[1] * inner, inner, s[3], 1};
          const int64_t b_strides[4] = {0, 1, 0, 0};
          const auto wa = widen(a), wb = widen(b);
          std::vector<ref_t<T>> want(static_cast<size_t>(n));
          if (b_first) {
            cpu::binary_broadcast(op, wb.data(), b_strides, wa.data(), a_strides, want.data(),
                                  s.data(), 4);
          } else {
            cpu::binary_broadcast(op, wa.data(), a_strides, wb.data(), b_strides, want.data(),
                                  s.data(), 4);
          }
          expect_close(
              got, narrow<T>(want), kAtol, default_rtol<T>(),
              label<T>(op_name(op) + " C=" + std::to_string(s[1]) + (b_first ? " b first" : ""),
                       n));
        }
      }
    }
  });
}

TEST(EmuElementwise, BinaryBiasMatchesCpu) {
  constexpr std::array<std::array<int64_t, 2>, 6> kShapes = {
      {{1, 1}, {1, 31}, {33, 1}, {40, 25}, {17, 241}, {3, 1000}}};
  for_each_float_type([&]<class T>() {
    for (const auto op : kBinaryOps) {
      for (const bool b_first : {false, true}) {
        for (const auto& s : kShapes) {
          const int64_t n = s[0] * s[1];
          const auto a = divisor_values<T>(n, 800 + n);
          const auto b = divisor_values<T>(s[1], 900 + s[1]);
          std::vector<T> got(static_cast<size_t>(n));
          cuda::binary_bias(op, a.data(), b.data(), got.data(), s[0], s[1], b_first, nullptr);
          const int64_t a_strides[2] = {s[1], 1};
          const int64_t b_strides[2] = {0, 1};
          const auto wa = widen(a), wb = widen(b);
          std::vector<ref_t<T>> want(static_cast<size_t>(n));
          if (b_first) {
            cpu::binary_broadcast(op, wb.data(), b_strides, wa.data(), a_strides, want.data(),
                                  s.data(), 2);
          } else {
            cpu::binary_broadcast(op, wa.data(), a_strides, wb.data(), b_strides, want.data(),
                                  s.data(), 2);
          }
          expect_close(
              got, narrow<T>(want), kAtol, default_rtol<T>(),
              label<T>(op_name(op) + " cols=" + std::to_string(s[1]) + (b_first ? " b first" : ""),
                       n));
        }
      }
    }
  });
}

// The general broadcast: both operands broadcast, gaps of ones, 0-d and up to 8 dimensions.
TEST(EmuElementwise, BinaryBroadcastMatchesCpu) {
  struct Case {
    std::vector<int64_t> out, a, b;  // a and b: the operand shapes right-aligned to out
  };
  const std::vector<Case> cases = {
      {{6, 4, 5}, {6, 1, 5}, {1, 4, 1}},
      {{2, 3, 4}, {2, 3, 4}, {2, 1, 4}},
      {{33, 31}, {33, 1}, {1, 31}},
      {{7}, {1}, {7}},
      {{2, 1, 3, 1, 2, 3, 1, 2}, {2, 1, 3, 1, 1, 3, 1, 2}, {1, 1, 1, 1, 2, 1, 1, 1}},
  };
  const auto strides = [](const std::vector<int64_t>& s) {
    std::vector<int64_t> st(s.size(), 0);
    int64_t acc = 1;
    for (size_t i = s.size(); i-- > 0;) {
      st[i] = s[i] == 1 ? 0 : acc;
      acc *= s[i];
    }
    return std::pair{st, acc};
  };
  for_each_float_type([&]<class T>() {
    for (const auto op : kBinaryOps) {
      for (const Case& c : cases) {
        const auto [as, an] = strides(c.a);
        const auto [bs, bn] = strides(c.b);
        const int64_t n =
            std::accumulate(c.out.begin(), c.out.end(), int64_t(1), std::multiplies<int64_t>());
        const auto a = random_values<T>(an, 1000 + an);
        const auto b = divisor_values<T>(bn, 1100 + bn);
        std::vector<T> got(static_cast<size_t>(n));
        const int nd = int(c.out.size());
        cuda::binary_broadcast(op, a.data(), as.data(), b.data(), bs.data(), got.data(),
                               c.out.data(), nd, nullptr);
        std::vector<ref_t<T>> want(static_cast<size_t>(n));
        const auto wa = widen(a), wb = widen(b);
        cpu::binary_broadcast(op, wa.data(), as.data(), wb.data(), bs.data(), want.data(),
                              c.out.data(), nd);
        expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(),
                     label<T>(op_name(op) + " ndim " + std::to_string(nd), n));
      }
    }
    std::vector<T> x(1);
    const int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, st[9] = {};
    EXPECT_THROW(cuda::binary_broadcast(cpu::BinaryOp::add, x.data(), st, x.data(), st, x.data(),
                                        shape, 9, nullptr),
                 Error);
  });
}

TEST(EmuElementwise, AxpyMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const int64_t n : kAwkwardSizes) {
      const auto x = random_values<T>(n, 1200 + n);
      auto got = random_values<T>(n, 1300 + n);
      auto want = widen(got);
      cuda::axpy(-0.75, x.data(), got.data(), n, nullptr);
      cpu::axpy(ref_t<T>(-0.75), widen(x).data(), want.data(), n);
      expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(), label<T>("axpy", n));
    }
  });
}

TEST(EmuElementwise, GridStrideCoversMoreThanOneGrid) {
  // Past 4096 blocks of 256 threads the launch grid is capped and each thread loops.
  const int64_t n = 4096 * 256 + 4097;
  const auto a = random_values<float>(n, 11), b = random_values<float>(n, 12);
  std::vector<float> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
  cuda::binary(cpu::BinaryOp::mul, a.data(), b.data(), got.data(), n, nullptr);
  cpu::binary(cpu::BinaryOp::mul, a.data(), b.data(), want.data(), n);
  expect_close(got, want, 0, 0, "mul n=" + std::to_string(n));
}

TEST(EmuElementwise, NanAndInfPropagate) {
  const std::vector<float> a = {NAN, INFINITY, -INFINITY, 1.f, 0.f};
  const std::vector<float> b = {1.f, 1.f, 2.f, NAN, 0.f};
  std::vector<float> got(a.size());
  cuda::binary(cpu::BinaryOp::div, a.data(), b.data(), got.data(), int64_t(a.size()), nullptr);
  EXPECT_TRUE(std::isnan(got[0]));
  EXPECT_EQ(got[1], INFINITY);
  EXPECT_EQ(got[2], -INFINITY);
  EXPECT_TRUE(std::isnan(got[3]));
  EXPECT_TRUE(std::isnan(got[4]));  // 0 / 0
}

TEST(EmuElementwise, ZeroSizeDoesNothing) {
  std::vector<float> a = {1.f}, b = {2.f}, out = {42.f};
  cuda::unary(cpu::UnaryOp::exp, a.data(), out.data(), 0, nullptr);
  cuda::pow_scalar(a.data(), 3.0, out.data(), 0, nullptr);
  cuda::binary(cpu::BinaryOp::add, a.data(), b.data(), out.data(), 0, nullptr);
  cuda::binary_scalar(cpu::BinaryOp::add, a.data(), 1.0, out.data(), 0, false, nullptr);
  cuda::binary_per_channel(cpu::BinaryOp::add, a.data(), b.data(), out.data(), 0, 1, 1, false,
                           nullptr);
  cuda::binary_per_channel(cpu::BinaryOp::add, a.data(), b.data(), out.data(), 1, 1, 0, false,
                           nullptr);
  cuda::binary_bias(cpu::BinaryOp::add, a.data(), b.data(), out.data(), 0, 1, false, nullptr);
  EXPECT_EQ(out[0], 42.f);
}

TEST(EmuElementwise, NegativeSizeThrows) {
  std::vector<float> a = {1.f}, out = {0.f};
  EXPECT_THROW(cuda::unary(cpu::UnaryOp::neg, a.data(), out.data(), -1, nullptr), rg::Error);
  EXPECT_THROW(cuda::binary(cpu::BinaryOp::add, a.data(), a.data(), out.data(), -1, nullptr),
               rg::Error);
  EXPECT_THROW(
      cuda::binary_bias(cpu::BinaryOp::add, a.data(), a.data(), out.data(), -1, 1, false, nullptr),
      rg::Error);
}

}  // namespace
}  // namespace rg::emu_kernel_test
