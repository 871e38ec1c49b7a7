// kernels/reduce.h: Reduce<Cuda> (kernels/cuda/reduce.cu under the emulator) against Reduce<Cpu>:
// sum/mean along a dimension and over all elements, every storage type, awkward sizes;
// bit-identical reruns.
#include "kernels/reduce.h"

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
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

using Cu = kernels::Reduce<kernels::Cuda>;
using Cpu = kernels::Reduce<kernels::Cpu>;

kernels::Workspace as_workspace(std::vector<unsigned char>& ws) {
  return {ws.data(), int64_t(ws.size())};
}

// Absolute slack for a sum of values whose magnitudes add up to abs_sum: both sides accumulate
// in f64, in different orders, and round once to T.
template <class T>
double sum_atol(double abs_sum) {
  return (std::is_same_v<T, double> ? 1e-12 : 1e-7) * abs_sum + 1e-12;
}

template <class T>
void check_dim(int64_t outer, int64_t r, int64_t inner, bool mean) {
  const int64_t n = outer * r * inner;
  const auto x = random_values<T>(n, uint64_t(outer * 1000003 + r * 101 + inner));
  std::vector<T> got(size_t(outer * inner));
  if (mean) {
    Cu::mean_dim<T>(x.data(), got.data(), outer, r, inner, {});
  } else {
    Cu::sum_dim<T>(x.data(), got.data(), outer, r, inner, {});
  }
  const auto xr = widen(x);
  std::vector<ref_t<T>> want(got.size()), abs_x(xr.size()), abs_sum(got.size());
  if (mean) {
    Cpu::mean_dim<ref_t<T>>(xr.data(), want.data(), outer, r, inner, {});
  } else {
    Cpu::sum_dim<ref_t<T>>(xr.data(), want.data(), outer, r, inner, {});
  }
  for (size_t i = 0; i < xr.size(); ++i) abs_x[i] = std::fabs(xr[i]);
  Cpu::sum_dim<ref_t<T>>(abs_x.data(), abs_sum.data(), outer, r, inner, {});
  double atol = sum_atol<T>(double(*std::max_element(abs_sum.begin(), abs_sum.end())));
  if (mean) atol /= double(r);
  expect_close(got, want, atol, default_rtol<T>(),
               ::rg::detail::cat(mean ? "mean_dim " : "sum_dim ", type_name<T>(), " (", outer, ", ",
                                 r, ", ", inner, ")"));
}

template <class T>
void check_all(int64_t n, bool mean) {
  const auto x = random_values<T>(n, uint64_t(n * 7 + 1));
  std::vector<unsigned char> workspace(size_t(Cu::sum_all_workspace_bytes(n)));
  std::vector<T> got(1);
  if (mean) {
    Cu::mean_all<T>(x.data(), n, got.data(), as_workspace(workspace), {});
  } else {
    Cu::sum_all<T>(x.data(), n, got.data(), as_workspace(workspace), {});
  }
  const auto xr = widen(x);
  std::vector<ref_t<T>> abs_x(xr.size()), want(1), abs_total(1);
  for (size_t i = 0; i < xr.size(); ++i) abs_x[i] = std::fabs(xr[i]);
  if (mean) {
    Cpu::mean_all<ref_t<T>>(xr.data(), n, want.data(), as_workspace(workspace), {});
  } else {
    Cpu::sum_all<ref_t<T>>(xr.data(), n, want.data(), as_workspace(workspace), {});
  }
  Cpu::sum_all<ref_t<T>>(abs_x.data(), n, abs_total.data(), as_workspace(workspace), {});
  double atol = sum_atol<T>(double(abs_total[0]));
  if (mean) atol /= double(n);
  expect_close(got, want, atol, default_rtol<T>(),
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
  std::vector<unsigned char> workspace(size_t(Cu::sum_all_workspace_bytes(0)));
  const auto both = [&]<class K>() {
    std::vector<float> out(4, 7.f);
    K::template sum_all<float>(nullptr, 0, out.data(), as_workspace(workspace), {});
    EXPECT_EQ(out[0], 0.f);
    K::template mean_all<float>(nullptr, 0, out.data(), as_workspace(workspace), {});
    EXPECT_TRUE(std::isnan(out[0]));
    const std::vector<float> none;
    K::template sum_dim<float>(none.data(), out.data(), 2, 0, 2, {});
    EXPECT_EQ(out, std::vector<float>(4, 0.f));
    K::template mean_dim<float>(none.data(), out.data(), 2, 0, 2, {});
    EXPECT_TRUE(std::isnan(out[0]));
    K::template sum_dim<float>(none.data(), nullptr, 0, 5, 2, {});  // no output: nothing to do
  };
  both.template operator()<Cu>();
  both.template operator()<Cpu>();
}

// The same inputs give bit-identical results: the reduction tree is fixed by the shape, and no
// floating-point atomics are used, although the emulator runs blocks in parallel.
TEST(EmuReduce, ReductionsAreDeterministic) {
  const int64_t n = 300007;
  const auto x = random_values<float>(n, 42, -1e3f, 1e3f);
  std::vector<unsigned char> workspace(size_t(Cu::sum_all_workspace_bytes(n)));
  ASSERT_GT(Cu::sum_all_partials(n), 1);
  float a = 0, b = 0;
  Cu::sum_all<float>(x.data(), n, &a, as_workspace(workspace), {});
  Cu::sum_all<float>(x.data(), n, &b, as_workspace(workspace), {});
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(float)), 0);
  for (const auto& [outer, r, inner] :
       {std::array<int64_t, 3>{7, 42857, 1}, std::array<int64_t, 3>{1, 9091, 33},
        std::array<int64_t, 3>{3, 3001, 33}}) {
    std::vector<float> y1(size_t(outer * inner)), y2(y1.size());
    Cu::sum_dim<float>(x.data(), y1.data(), outer, r, inner, {});
    Cu::sum_dim<float>(x.data(), y2.data(), outer, r, inner, {});
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0)
        << "(" << outer << ", " << r << ", " << inner << ")";
  }
}

// Every sum accumulates in f64 on both backends (CUDA and the CPU's column sums used f32): small
// values after a large one survive, and the CPU's sum_all no longer depends on the thread count.
TEST(EmuReduce, SumsAccumulateInDoubleOnBothBackends) {
  const int64_t r = 1 << 16;
  std::vector<float> x(size_t(2 * r), 1e-3f);
  x[0] = 4096.f;  // column 0 of a (r, 2) array, and row 0 of a (2, r) one
  x[1] = 4096.f;
  const double exact = 4096.0 + double(r - 1) * double(1e-3f);
  const auto both = [&]<class K>() {
    std::vector<float> cols(2), rows(2), all(1);
    K::template sum_dim<float>(x.data(), cols.data(), 1, r, 2, {});
    EXPECT_EQ(cols[0], float(exact));
    K::template sum_dim<float>(x.data(), rows.data(), 2, r, 1, {});
    EXPECT_EQ(rows[0], float(4096.0 + 4096.0 + double(r - 2) * double(1e-3f)));
    std::vector<unsigned char> ws(size_t(K::sum_all_workspace_bytes(2 * r)));
    K::template sum_all<float>(x.data(), 2 * r, all.data(), as_workspace(ws), {});
    EXPECT_EQ(all[0], float(8192.0 + double(2 * r - 2) * double(1e-3f)));
  };
  both.template operator()<Cu>();
  both.template operator()<Cpu>();
}

TEST(EmuReduce, RejectsBadArgumentsOnBothBackends) {
  std::vector<float> x(5000), out(8);
  std::vector<unsigned char> ws(size_t(Cu::sum_all_workspace_bytes(5000)));
  const auto both = [&]<class K>() {
    EXPECT_THROW(K::template sum_dim<float>(x.data(), out.data(), -1, 2, 2, {}), Error);
    EXPECT_THROW(K::template mean_all<float>(x.data(), -3, out.data(), as_workspace(ws), {}),
                 Error);
    EXPECT_THROW(K::template sum_all<float>(x.data(), 5000, out.data(), kernels::Workspace{}, {}),
                 InternalError);
  };
  both.template operator()<Cu>();
  both.template operator()<Cpu>();
}

}  // namespace
}  // namespace rg::emu_kernel_test
