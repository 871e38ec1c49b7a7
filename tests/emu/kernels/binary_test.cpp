// kernels/binary.h: Binary<Cuda> (kernels/cuda/binary.cu under the CUDA emulator) against
// Binary<Cpu> on the same arguments: every op, same shape, scalar, per-channel, general broadcast
// and axpy, awkward sizes, in f32, f64, f16 and bf16.
#include "kernels/binary.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

using kernels::BinaryOp;
using CudaBinary = kernels::Binary<kernels::Cuda>;
using CpuBinary = kernels::Binary<kernels::Cpu>;

constexpr std::array kBinaryOps = {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div};
constexpr double kAtol = 1e-6;

std::string op_name(BinaryOp op) { return "binary op " + std::to_string(int(op)); }

// Second operands stay away from zero so that div is well conditioned in f16.
template <class T>
std::vector<T> divisor_values(int64_t n, uint64_t seed) {
  std::vector<T> v = random_values<T>(n, seed, 0.25f, 2.f);
  for (size_t i = 0; i < v.size(); i += 2) v[i] = kernels::cpu::convert<T>(-as_double(v[i]));
  return v;
}

TEST(EmuBinary, BinarySameShapeMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto op : kBinaryOps) {
      for (const int64_t n : kAwkwardSizes) {
        const auto a = random_values<T>(n, 300 + n);
        const auto b = divisor_values<T>(n, 400 + n);
        std::vector<T> got(static_cast<size_t>(n));
        CudaBinary::binary(op, a.data(), b.data(), got.data(), n, {});
        std::vector<ref_t<T>> want(static_cast<size_t>(n));
        CpuBinary::binary(op, widen(a).data(), widen(b).data(), want.data(), n, {});
        expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(), label<T>(op_name(op), n));
      }
    }
  });
}

TEST(EmuBinary, BinaryInPlaceMatchesCpu) {
  // out aliasing an input (a += b) is how the engine accumulates gradients.
  for_each_float_type([]<class T>() {
    const int64_t n = 4097;
    auto a = random_values<T>(n, 7);
    const auto b = random_values<T>(n, 8);
    std::vector<ref_t<T>> want(static_cast<size_t>(n));
    CpuBinary::binary(BinaryOp::add, widen(a).data(), widen(b).data(), want.data(), n, {});
    CudaBinary::binary(BinaryOp::add, a.data(), b.data(), a.data(), n, {});
    expect_close(a, narrow<T>(want), kAtol, default_rtol<T>(), label<T>("in place add", n));
  });
}

TEST(EmuBinary, BinaryScalarMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto op : kBinaryOps) {
      for (const bool scalar_first : {false, true}) {
        for (const int64_t n : kAwkwardSizes) {
          const double s = -1.7;
          const auto a = divisor_values<T>(n, 500 + n);
          std::vector<T> got(static_cast<size_t>(n));
          CudaBinary::binary_scalar(op, a.data(), s, got.data(), n, scalar_first, {});
          std::vector<ref_t<T>> want(static_cast<size_t>(n));
          CpuBinary::binary_scalar(op, widen(a).data(), s, want.data(), n, scalar_first, {});
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

TEST(EmuBinary, BinaryPerChannelMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto op : kBinaryOps) {
      for (const bool b_first : {false, true}) {
        for (const auto& s : kNchwShapes) {
          const int64_t n = s[0] * s[1] * s[2] * s[3], inner = s[2] * s[3];
          const auto a = divisor_values<T>(n, 600 + n);
          const auto b = divisor_values<T>(s[1], 700 + s[1]);
          std::vector<T> got(static_cast<size_t>(n));
          CudaBinary::binary_per_channel(op, a.data(), b.data(), got.data(), s[0], s[1], inner,
                                         b_first, {});
          const int64_t a_strides[4] = {s[1] * inner, inner, s[3], 1};
          const int64_t b_strides[4] = {0, 1, 0, 0};
          const auto wa = widen(a), wb = widen(b);
          std::vector<ref_t<T>> want(static_cast<size_t>(n));
          if (b_first) {
            CpuBinary::binary_broadcast(op, wb.data(), b_strides, wa.data(), a_strides, want.data(),
                                        s.data(), 4, {});
          } else {
            CpuBinary::binary_broadcast(op, wa.data(), a_strides, wb.data(), b_strides, want.data(),
                                        s.data(), 4, {});
          }
          const std::string what =
              label<T>(op_name(op) + " C=" + std::to_string(s[1]) + (b_first ? " b first" : ""), n);
          expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(), what);
          // The CPU kernel, same arguments: the broadcast's values exactly.
          std::vector<ref_t<T>> cpu_got(static_cast<size_t>(n));
          CpuBinary::binary_per_channel(op, wa.data(), wb.data(), cpu_got.data(), s[0], s[1], inner,
                                        b_first, {});
          expect_close(cpu_got, want, 0.0, 0.0, what + " (CPU)");
        }
      }
    }
  });
}

TEST(EmuBinary, BinaryPerChannelOfRowsMatchesCpu) {
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
          CudaBinary::binary_per_channel(op, a.data(), b.data(), got.data(), s[0], s[1], 1, b_first,
                                         {});
          const int64_t a_strides[2] = {s[1], 1};
          const int64_t b_strides[2] = {0, 1};
          const auto wa = widen(a), wb = widen(b);
          std::vector<ref_t<T>> want(static_cast<size_t>(n));
          if (b_first) {
            CpuBinary::binary_broadcast(op, wb.data(), b_strides, wa.data(), a_strides, want.data(),
                                        s.data(), 2, {});
          } else {
            CpuBinary::binary_broadcast(op, wa.data(), a_strides, wb.data(), b_strides, want.data(),
                                        s.data(), 2, {});
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
TEST(EmuBinary, BinaryBroadcastMatchesCpu) {
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
        CudaBinary::binary_broadcast(op, a.data(), as.data(), b.data(), bs.data(), got.data(),
                                     c.out.data(), nd, {});
        std::vector<ref_t<T>> want(static_cast<size_t>(n));
        const auto wa = widen(a), wb = widen(b);
        CpuBinary::binary_broadcast(op, wa.data(), as.data(), wb.data(), bs.data(), want.data(),
                                    c.out.data(), nd, {});
        expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(),
                     label<T>(op_name(op) + " ndim " + std::to_string(nd), n));
      }
    }
    std::vector<T> x(1);
    const int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, st[9] = {};
    EXPECT_THROW(CudaBinary::binary_broadcast(BinaryOp::add, x.data(), st, x.data(), st, x.data(),
                                              shape, 9, {}),
                 Error);
  });
}

TEST(EmuBinary, AxpyMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const int64_t n : kAwkwardSizes) {
      const auto x = random_values<T>(n, 1200 + n);
      auto got = random_values<T>(n, 1300 + n);
      auto want = widen(got);
      CudaBinary::axpy(-0.75, x.data(), got.data(), n, {});
      CpuBinary::axpy(-0.75, widen(x).data(), want.data(), n, {});
      expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(), label<T>("axpy", n));
    }
  });
}

TEST(EmuBinary, GridStrideCoversMoreThanOneGrid) {
  // Past kMaxBlocks (4095) blocks of 256 threads the launch grid is capped and each thread loops.
  const int64_t n = 4096 * 256 + 4097;
  const auto a = random_values<float>(n, 11), b = random_values<float>(n, 12);
  std::vector<float> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
  CudaBinary::binary(BinaryOp::mul, a.data(), b.data(), got.data(), n, {});
  CpuBinary::binary(BinaryOp::mul, a.data(), b.data(), want.data(), n, {});
  expect_close(got, want, 0, 0, "mul n=" + std::to_string(n));
}

TEST(EmuBinary, NanAndInfPropagate) {
  const std::vector<float> a = {NAN, INFINITY, -INFINITY, 1.f, 0.f};
  const std::vector<float> b = {1.f, 1.f, 2.f, NAN, 0.f};
  std::vector<float> got(a.size());
  CudaBinary::binary(BinaryOp::div, a.data(), b.data(), got.data(), int64_t(a.size()), {});
  EXPECT_TRUE(std::isnan(got[0]));
  EXPECT_EQ(got[1], INFINITY);
  EXPECT_EQ(got[2], -INFINITY);
  EXPECT_TRUE(std::isnan(got[3]));
  EXPECT_TRUE(std::isnan(got[4]));  // 0 / 0
}

TEST(EmuBinary, ZeroSizeDoesNothing) {
  std::vector<float> a = {1.f}, b = {2.f}, out = {42.f};
  CudaBinary::binary(BinaryOp::add, a.data(), b.data(), out.data(), 0, {});
  CudaBinary::binary_scalar(BinaryOp::add, a.data(), 1.0, out.data(), 0, false, {});
  CudaBinary::binary_per_channel(BinaryOp::add, a.data(), b.data(), out.data(), 0, 1, 1, false, {});
  CudaBinary::binary_per_channel(BinaryOp::add, a.data(), b.data(), out.data(), 1, 1, 0, false, {});
  EXPECT_EQ(out[0], 42.f);
}

TEST(EmuBinary, NegativeSizeThrows) {
  std::vector<float> a = {1.f}, out = {0.f};
  EXPECT_THROW(CudaBinary::binary(BinaryOp::add, a.data(), a.data(), out.data(), -1, {}),
               rg::Error);
  EXPECT_THROW(CudaBinary::binary_per_channel(BinaryOp::add, a.data(), a.data(), out.data(), -1, 1,
                                              1, false, {}),
               rg::Error);
  EXPECT_THROW(CpuBinary::binary_per_channel(BinaryOp::add, a.data(), a.data(), out.data(), -1, 1,
                                             1, false, {}),
               rg::Error);
}

}  // namespace
}  // namespace rg::emu_kernel_test
