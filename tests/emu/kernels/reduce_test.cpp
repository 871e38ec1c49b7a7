// kernels/cuda/reduce.cu under the CUDA emulator against kernels/cpu/reduce.h: sum/mean along a
// dimension and over all elements, every storage type, awkward sizes; bit-identical reruns.
#include "kernels/cuda/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/cpu/reduce.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

namespace cu = kernels::cuda;
namespace cpu = kernels::cpu;

// Absolute slack for a sum of values whose magnitudes add up to abs_sum: both sides accumulate
// in (at least) f32, in different orders.
template <class T>
double sum_atol(double abs_sum) {
  return (std::is_same_v<T, double> ? 1e-12 : 2e-6) * abs_sum + 1e-12;
}

template <class T>
void check_dim(int64_t outer, int64_t r, int64_t inner, bool mean) {
  const int64_t n = outer * r * inner;
  const auto x = random_values<T>(n, uint64_t(outer * 1000003 + r * 101 + inner));
  std::vector<T> got(size_t(outer * inner));
  if (mean) {
    cu::mean_dim<T>(x.data(), got.data(), outer, r, inner, nullptr);
  } else {
    cu::sum_dim<T>(x.data(), got.data(), outer, r, inner, nullptr);
  }
  const auto xr = widen(x);
  std::vector<ref_t<T>> want(got.size()), abs_x(xr.size()), abs_sum(got.size());
  cpu::sum_dim<ref_t<T>>(xr.data(), want.data(), outer, r, inner);
  for (size_t i = 0; i < xr.size(); ++i) abs_x[i] = std::fabs(xr[i]);
  cpu::sum_dim<ref_t<T>>(abs_x.data(), abs_sum.data(), outer, r, inner);
  double atol = sum_atol<T>(double(*std::max_element(abs_sum.begin(), abs_sum.end())));
  if (mean) {
    // The engine's mean: the sum times 1 / count.
    for (auto& w : want) w = ref_t<T>(w * ref_t<T>(1.0 / double(r)));
    atol /= double(r);
  }
  expect_close(got, want, atol, default_rtol<T>(),
               ::rg::detail::cat(mean ? "mean_dim " : "sum_dim ", type_name<T>(), " (", outer, ", ",
                                 r, ", ", inner, ")"));
}

template <class T>
void check_all(int64_t n, bool mean) {
  const auto x = random_values<T>(n, uint64_t(n * 7 + 1));
  std::vector<unsigned char> workspace(size_t(cu::sum_all_workspace_bytes(n)));
  std::vector<T> got(1);
  if (mean) {
    cu::mean_all<T>(x.data(), n, got.data(), workspace.data(), nullptr);
  } else {
    cu::sum_all<T>(x.data(), n, got.data(), workspace.data(), nullptr);
  }
  const auto xr = widen(x);
  std::vector<ref_t<T>> abs_x(xr.size());
  for (size_t i = 0; i < xr.size(); ++i) abs_x[i] = std::fabs(xr[i]);
  double want = cpu::sum_all<ref_t<T>>(xr.data(), n);
  double atol = sum_atol<T>(cpu::sum_all<ref_t<T>>(abs_x.data(), n));
  if (mean) {
    want /= double(n);
    atol /= double(n);
  }
  expect_close(got, std::vector<double>{want}, atol, default_rtol<T>(),
               ::rg::detail::cat(mean ? "mean_all " : "sum_all ", type_name<T>(), " n=", n));
}

TEST(EmuReduce, SumAlongLastDimMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (int64_t r : kAwkwardSizes) {
      for (int64_t outer : {int64_t(1), int64_t(3), int64_t(33)}) check_dim<T>(outer, r, 1, false);
    }
  });
}

TEST(EmuReduce, SumAlongMiddleDimMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (int64_t r : kAwkwardSizes) {
      for (int64_t inner : {int64_t(5), int64_t(33)}) check_dim<T>(3, r, inner, false);
    }
    for (int64_t inner : kAwkwardSizes) check_dim<T>(2, 17, inner, false);
  });
}

TEST(EmuReduce, SumAlongFirstDimMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (int64_t r : kAwkwardSizes) check_dim<T>(1, r, 31, false);
    for (int64_t inner : kAwkwardSizes) check_dim<T>(1, 33, inner, false);
  });
}

TEST(EmuReduce, MeanAlongDimsMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (int64_t r : kAwkwardSizes) {
      check_dim<T>(3, r, 1, true);
      check_dim<T>(2, r, 33, true);
    }
  });
}

TEST(EmuReduce, SumAllMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (int64_t n : kAwkwardSizes) check_all<T>(n, false);
    check_all<T>(100003, false);  // many first-pass blocks
  });
}

TEST(EmuReduce, MeanAllMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (int64_t n : kAwkwardSizes) check_all<T>(n, true);
    check_all<T>(100003, true);
  });
}

TEST(EmuReduce, EmptyReductions) {
  std::vector<float> out(4, 7.f);
  cu::sum_all<float>(nullptr, 0, out.data(), nullptr, nullptr);
  EXPECT_EQ(out[0], 0.f);
  cu::mean_all<float>(nullptr, 0, out.data(), nullptr, nullptr);
  EXPECT_TRUE(std::isnan(out[0]));
  const std::vector<float> none;
  cu::sum_dim<float>(none.data(), out.data(), 2, 0, 2, nullptr);
  EXPECT_EQ(out, std::vector<float>(4, 0.f));
  cu::sum_dim<float>(none.data(), nullptr, 0, 5, 2, nullptr);  // no output: nothing launched
}

// The same inputs give bit-identical results: the reduction tree is fixed by the shape, and no
// floating-point atomics are used, although the emulator runs blocks in parallel.
TEST(EmuReduce, ReductionsAreDeterministic) {
  const int64_t n = 300007;
  const auto x = random_values<float>(n, 42, -1e3f, 1e3f);
  std::vector<unsigned char> workspace(size_t(cu::sum_all_workspace_bytes(n)));
  ASSERT_GT(workspace.size(), 0u);
  float a = 0, b = 0;
  cu::sum_all<float>(x.data(), n, &a, workspace.data(), nullptr);
  cu::sum_all<float>(x.data(), n, &b, workspace.data(), nullptr);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(float)), 0);
  for (const auto& [outer, r, inner] :
       {std::array<int64_t, 3>{7, 42857, 1}, std::array<int64_t, 3>{1, 9091, 33},
        std::array<int64_t, 3>{3, 3001, 33}}) {
    std::vector<float> y1(size_t(outer * inner)), y2(y1.size());
    cu::sum_dim<float>(x.data(), y1.data(), outer, r, inner, nullptr);
    cu::sum_dim<float>(x.data(), y2.data(), outer, r, inner, nullptr);
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0)
        << "(" << outer << ", " << r << ", " << inner << ")";
  }
}

TEST(EmuReduce, RejectsBadArguments) {
  std::vector<float> x(5000), out(8);
  EXPECT_THROW(cu::sum_dim<float>(x.data(), out.data(), -1, 2, 2, nullptr), Error);
  EXPECT_THROW(cu::mean_all<float>(x.data(), -3, out.data(), nullptr, nullptr), Error);
  ASSERT_GT(cu::sum_all_workspace_bytes(5000), 0);
  EXPECT_THROW(cu::sum_all<float>(x.data(), 5000, out.data(), nullptr, nullptr), Error);
}

}  // namespace
}  // namespace rg::emu_kernel_test
