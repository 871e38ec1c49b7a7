// kernels/cuda/gemm.cu under the CUDA emulator (its cuBLAS calls served by the emulated cuBLAS of
// kernels/emu/cublas.cpp) against kernels/cpu/gemm: every transpose combination, padded leading
// dimensions, alpha/beta, an empty inner dimension, and the half types with f32 accumulation.
// This checks our row-major -> column-major mapping and argument checks; cuBLAS itself only runs
// in the gpu tests.
#include "kernels/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

using CpuGemm = kernels::Gemm<kernels::Cpu>;
using CudaGemm = kernels::Gemm<kernels::Cuda>;

struct GemmCase {
  bool ta, tb;
  int64_t m, n, k, pad;  // pad: extra elements at the end of every stored row
  double alpha, beta;
};

const std::vector<GemmCase> kCases = {
    {false, false, 33, 31, 17, 0, 1.0, 0.0}, {false, true, 33, 31, 17, 0, 1.0, 0.0},
    {true, false, 33, 31, 17, 0, 1.0, 0.0},  {true, true, 33, 31, 17, 0, 1.0, 0.0},
    {false, true, 1, 1000, 33, 3, 0.5, 1.0}, {true, false, 7, 5, 1000, 2, -2.0, 0.25},
    {false, false, 5, 4, 0, 0, 1.0, 0.0},    {false, false, 5, 4, 0, 1, 1.0, 2.0},
};

TEST(EmuGemm, EveryLayoutMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const GemmCase& c : kCases) {
      const int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
      const int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
      const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.n + c.pad;
      const auto a = random_values<T>(a_rows * lda, 1);
      const auto b = random_values<T>(b_rows * ldb, 2);
      auto out = random_values<T>(c.m * ldc, 3);
      // The reference: f32/f64 GEMM on the widened values (the half types accumulate in f32),
      // rounded once.
      auto ref = widen(out);
      // The CPU kernel handles k == 0 (C = beta * C, the padding untouched) as cuBLAS does.
      CpuGemm::gemm(c.ta, c.tb, c.m, c.n, c.k, c.alpha, widen(a).data(), lda, widen(b).data(), ldb,
                    c.beta, ref.data(), ldc, false, {}, {});
      CudaGemm::gemm(c.ta, c.tb, c.m, c.n, c.k, c.alpha, a.data(), lda, b.data(), ldb, c.beta,
                     out.data(), ldc, /*allow_tf32=*/false, {}, {});
      const std::string what = std::string(c.ta ? "T" : "N") + (c.tb ? "T" : "N") + " " +
                               std::to_string(c.m) + "x" + std::to_string(c.n) + "x" +
                               std::to_string(c.k);
      expect_close(out, narrow<T>(ref), 1e-5, default_rtol<T>(), what);
    }
  });
}

TEST(EmuGemm, RejectsSizesBeyondBlasIntsOnBothBackends) {
  std::vector<float> x(4);
  const auto both = [&]<class K>() {
    EXPECT_THROW(K::template gemm<float>(false, false, int64_t(1) << 31, 1, 1, 1.0, x.data(), 1,
                                         x.data(), 1, 0.0, x.data(), 1, false, {}, {}),
                 Error);
  };
  both.template operator()<CudaGemm>();
  both.template operator()<CpuGemm>();
  EXPECT_THROW(CudaGemm::gemm<float>(false, false, 1, 1, 1, 1.0, x.data(), 1, x.data(), 1, 0.0,
                                     x.data(), 1, false, kernels::Workspace{nullptr, 64}, {}),
               Error);  // a workspace size without a pointer
}

// k == 0 gives C = beta * C on both backends; the CPU used to hand BLAS leading dimensions of 0
// (the engine filled C itself instead).
TEST(EmuGemm, EmptyInnerDimensionScalesCOnBothBackends) {
  const auto both = [&]<class K>() {
    std::vector<float> c = {1.f, 2.f, 3.f, NAN};
    K::template gemm<float>(false, false, 2, 2, 0, 1.0, nullptr, 0, nullptr, 2, 0.5, c.data(), 2,
                            false, {}, {});
    EXPECT_EQ(c[0], 0.5f);
    EXPECT_EQ(c[2], 1.5f);
    K::template gemm<float>(false, false, 2, 2, 0, 1.0, nullptr, 0, nullptr, 2, 0.0, c.data(), 2,
                            false, {}, {});
    EXPECT_EQ(c, std::vector<float>(4, 0.f));  // beta == 0: C is not read, NaN included
  };
  both.template operator()<CudaGemm>();
  both.template operator()<CpuGemm>();
}

TEST(EmuGemm, WorkspaceFollowsTheComputeCapability) {
  // The emulated device reports compute capability 8.0: cuBLAS's 4 MiB recommendation.
  EXPECT_EQ(CudaGemm::workspace_bytes({}), int64_t(4) << 20);
  EXPECT_EQ(CpuGemm::workspace_bytes({}), 0);
}

}  // namespace
}  // namespace rg::emu_kernel_test
