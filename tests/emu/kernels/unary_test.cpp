// kernels/unary.h: Unary<Cuda> (kernels/cuda/unary.cu under the CUDA emulator) against Unary<Cpu>
// on the same arguments: every op and pow, awkward sizes, in f32, f64, f16 and bf16.
#include "kernels/unary.h"

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

using kernels::UnaryOp;
using CudaUnary = kernels::Unary<kernels::Cuda>;
using CpuUnary = kernels::Unary<kernels::Cpu>;

constexpr std::array kUnaryOps = {UnaryOp::neg, UnaryOp::exp, UnaryOp::log, UnaryOp::sqrt};
constexpr double kAtol = 1e-6;

std::string op_name(UnaryOp op) { return "unary op " + std::to_string(int(op)); }

TEST(EmuUnary, UnaryMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto op : kUnaryOps) {
      for (const int64_t n : kAwkwardSizes) {
        const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt;
        const auto x = random_values<T>(n, 100 + n, positive ? 0.05f : -2.f, 2.f);
        std::vector<T> got(static_cast<size_t>(n));
        CudaUnary::unary(op, x.data(), got.data(), n, {});
        std::vector<ref_t<T>> want(static_cast<size_t>(n));
        CpuUnary::unary(op, widen(x).data(), want.data(), n, {});
        expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(), label<T>(op_name(op), n));
      }
    }
  });
}

TEST(EmuUnary, PowScalarMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const double p : {2.0, 1.0, 0.5, 3.0, -1.5}) {
      for (const int64_t n : kAwkwardSizes) {
        const auto x = random_values<T>(n, 200 + n, 0.1f, 2.f);
        std::vector<T> got(static_cast<size_t>(n));
        CudaUnary::pow_scalar(x.data(), p, got.data(), n, {});
        std::vector<ref_t<T>> want(static_cast<size_t>(n));
        CpuUnary::pow_scalar(widen(x).data(), p, want.data(), n, {});
        expect_close(got, narrow<T>(want), kAtol, default_rtol<T>(),
                     label<T>("pow " + std::to_string(p), n));
      }
    }
  });
}

TEST(EmuUnary, ZeroSizeDoesNothingAndNegativeSizeThrows) {
  std::vector<float> a = {1.f}, out = {42.f};
  CudaUnary::unary(UnaryOp::exp, a.data(), out.data(), 0, {});
  CudaUnary::pow_scalar(a.data(), 3.0, out.data(), 0, {});
  EXPECT_EQ(out[0], 42.f);
  EXPECT_THROW(CudaUnary::unary(UnaryOp::neg, a.data(), out.data(), -1, {}), rg::Error);
  EXPECT_THROW(CpuUnary::unary(UnaryOp::neg, a.data(), out.data(), -1, {}), rg::Error);
  EXPECT_THROW(CpuUnary::pow_scalar(a.data(), 2.0, out.data(), -1, {}), rg::Error);
}

}  // namespace
}  // namespace rg::emu_kernel_test
