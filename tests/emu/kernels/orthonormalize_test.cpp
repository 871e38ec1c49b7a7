// kernels/cuda/orthonormalize.cu under the CUDA emulator against kernels/cpu/orthonormalize: the
// same orthonormal columns (to rounding: the sums run in another order), columns that are
// orthonormal, dependent columns zeroed, and shapes around the block's 256 threads.
#include "kernels/cuda/orthonormalize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "kernels/cpu/orthonormalize.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

template <class T>
double column_dot(const std::vector<T>& p, int64_t n, int64_t r, int64_t a, int64_t b) {
  double s = 0;
  for (int64_t k = 0; k < n; ++k) s += double(p[size_t(k * r + a)]) * double(p[size_t(k * r + b)]);
  return s;
}

template <class T>
void check_shape(int64_t n, int64_t r, uint64_t seed, double tol) {
  const std::string what = "n=" + std::to_string(n) + " r=" + std::to_string(r);
  std::vector<T> ref = random_values<T>(n * r, seed), dev = ref;
  std::vector<double> work(size_t(n * r));
  cpu::orthonormalize_columns<T>(ref.data(), n, r, work.data());
  cuda::orthonormalize_columns<T>(dev.data(), n, r, work.data(), nullptr);
  expect_close(dev, ref, tol, tol, what);
  for (int64_t a = 0; a < r && a < n; ++a)
    for (int64_t b = 0; b <= a; ++b)
      EXPECT_NEAR(column_dot(dev, n, r, a, b), a == b ? 1.0 : 0.0, 10 * tol)
          << what << " columns " << a << ", " << b;
}

TEST(EmuOrthonormalize, MatchesTheCpuKernelAndGivesOrthonormalColumns) {
  for (const auto& [n, r] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {31, 2}, {255, 4}, {256, 3}, {1000, 4}, {4097, 1}}) {
    check_shape<float>(n, r, uint64_t(n * 7 + r), 1e-5);
    check_shape<double>(n, r, uint64_t(n * 7 + r), 1e-12);
  }
}

TEST(EmuOrthonormalize, ADependentColumnBecomesZeroOnBothDevices) {
  // Column 2 = column 0 - 2 * column 1: after projecting out the first two nothing is left.
  const int64_t n = 300, r = 3;
  std::vector<float> p = random_values<float>(n * r, 11);
  for (int64_t k = 0; k < n; ++k)
    p[size_t(k * r + 2)] = p[size_t(k * r)] - 2.f * p[size_t(k * r + 1)];
  std::vector<float> ref = p, dev = p;
  std::vector<double> work(size_t(n * r));
  cpu::orthonormalize_columns<float>(ref.data(), n, r, work.data());
  cuda::orthonormalize_columns<float>(dev.data(), n, r, work.data(), nullptr);
  for (int64_t k = 0; k < n; ++k) {
    EXPECT_EQ(ref[size_t(k * r + 2)], 0.f) << "cpu row " << k;
    EXPECT_EQ(dev[size_t(k * r + 2)], 0.f) << "cuda row " << k;
  }
  EXPECT_NEAR(column_dot(dev, n, r, 1, 1), 1.0, 1e-5);
}

TEST(EmuOrthonormalize, EmptyMatricesAreLeftAlone) {
  std::vector<double> work(1);
  cuda::orthonormalize_columns<float>(nullptr, 0, 3, work.data(), nullptr);
  cuda::orthonormalize_columns<float>(nullptr, 5, 0, work.data(), nullptr);
  EXPECT_THROW(cuda::orthonormalize_columns<float>(nullptr, -1, 3, work.data(), nullptr),
               rg::Error);
}

}  // namespace
}  // namespace rg::emu_kernel_test
