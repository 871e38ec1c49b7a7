// kernels/pool.h: Pool<Cuda> (kernels/cuda/pool.cu under the CUDA emulator) against Pool<Cpu> on
// the same arguments: max pooling (values, argmax indices, NaN), average pooling with and without
// count_include_pad and global average pooling, forward and backward, every storage type, awkward
// sizes; the shared geometry checks and global average pooling's f64 sums.
#include "kernels/pool.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

using Cu = kernels::Pool<kernels::Cuda>;
using Cpu = kernels::Pool<kernels::Cpu>;
using kernels::Pool2dGeometry;

template <class T>
double atol() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-6;
}

// planes x h x w with kernel k, stride s, padding p (square unless given per axis).
Pool2dGeometry geometry(int64_t planes, int64_t h, int64_t w, std::array<int64_t, 2> k,
                        std::array<int64_t, 2> s, std::array<int64_t, 2> p) {
  Pool2dGeometry g{planes, h, w, k[0], k[1], s[0], s[1], p[0], p[1], 0, 0};
  g.ho = (h + 2 * p[0] - k[0]) / s[0] + 1;
  g.wo = (w + 2 * p[1] - k[1]) / s[1] + 1;
  return g;
}

// Planes of 1, 31, 33, 1000 and 4097 pixels; overlapping, strided and padded windows.
std::vector<Pool2dGeometry> geometries() {
  return {
      geometry(1, 1, 1, {1, 1}, {1, 1}, {0, 0}),   geometry(3, 1, 31, {1, 3}, {1, 2}, {0, 1}),
      geometry(2, 3, 11, {2, 2}, {2, 2}, {1, 1}),  geometry(6, 33, 1, {3, 1}, {1, 1}, {1, 0}),
      geometry(5, 7, 5, {3, 3}, {2, 2}, {1, 1}),   geometry(2, 40, 25, {3, 3}, {3, 3}, {0, 0}),
      geometry(33, 8, 8, {2, 2}, {2, 2}, {0, 0}),  geometry(1, 17, 241, {3, 5}, {2, 3}, {1, 2}),
      geometry(4, 31, 33, {4, 4}, {1, 1}, {2, 2}),
  };
}

std::string describe(const char* op, const char* type, const Pool2dGeometry& g) {
  return ::rg::detail::cat(op, " ", type, " planes=", g.planes, " ", g.h, "x", g.w, " k=", g.kh,
                           "x", g.kw, " s=", g.sh, "x", g.sw, " p=", g.ph, "x", g.pw);
}

template <class T>
void check_max_pool(const Pool2dGeometry& g) {
  const int64_t in_n = g.planes * g.h * g.w, out_n = g.planes * g.ho * g.wo;
  const auto x = random_values<T>(in_n, uint64_t(in_n + out_n));
  std::vector<T> y(static_cast<size_t>(out_n));
  std::vector<int64_t> argmax(y.size());
  Cu::max_pool2d<T>(g, x.data(), y.data(), argmax.data(), {});
  const auto xr = convert_all<ref_t<T>>(x);
  std::vector<ref_t<T>> want(y.size());
  std::vector<int64_t> want_argmax(y.size());
  Cpu::max_pool2d<ref_t<T>>(g, xr.data(), want.data(), want_argmax.data(), {});
  // The maxima are input elements: exact in every type.
  expect_close(y, want, 0.0, 0.0, describe("max_pool2d_forward", type_name<T>(), g));
  EXPECT_EQ(argmax, want_argmax) << describe("max_pool2d_forward argmax", type_name<T>(), g);

  const auto gy = random_values<T>(out_n, uint64_t(out_n + 3));
  std::vector<T> gx(static_cast<size_t>(in_n));
  Cu::max_pool2d_backward<T>(g, gy.data(), argmax.data(), gx.data(), {});
  std::vector<ref_t<T>> want_gx(gx.size());
  Cpu::max_pool2d_backward<ref_t<T>>(g, convert_all<ref_t<T>>(gy).data(), want_argmax.data(),
                                     want_gx.data(), {});
  expect_close(gx, want_gx, atol<T>(), default_rtol<T>(),
               describe("max_pool2d_backward", type_name<T>(), g));
}

template <class T>
void check_avg_pool(const Pool2dGeometry& g, bool count_include_pad) {
  const int64_t in_n = g.planes * g.h * g.w, out_n = g.planes * g.ho * g.wo;
  const char* mode = count_include_pad ? " include_pad" : " exclude_pad";
  const auto x = random_values<T>(in_n, uint64_t(in_n + 2 * out_n));
  std::vector<T> y(static_cast<size_t>(out_n));
  Cu::avg_pool2d<T>(g, x.data(), y.data(), count_include_pad, {});
  std::vector<ref_t<T>> want(y.size());
  Cpu::avg_pool2d<ref_t<T>>(g, convert_all<ref_t<T>>(x).data(), want.data(), count_include_pad, {});
  expect_close(y, want, atol<T>(), default_rtol<T>(),
               describe("avg_pool2d_forward", type_name<T>(), g) + mode);

  const auto gy = random_values<T>(out_n, uint64_t(out_n + 5));
  std::vector<T> gx(static_cast<size_t>(in_n));
  Cu::avg_pool2d_backward<T>(g, gy.data(), gx.data(), count_include_pad, {});
  std::vector<ref_t<T>> want_gx(gx.size());
  Cpu::avg_pool2d_backward<ref_t<T>>(g, convert_all<ref_t<T>>(gy).data(), want_gx.data(),
                                     count_include_pad, {});
  expect_close(gx, want_gx, atol<T>(), default_rtol<T>(),
               describe("avg_pool2d_backward", type_name<T>(), g) + mode);
}

TEST(EmuPool, MaxPoolForwardBackwardMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto& g : geometries()) check_max_pool<T>(g);
  });
}

// Max pooling of x (f32) by the emulated CUDA kernel and by the CPU kernel: expects the same
// values (NaN where the other has NaN) and the same argmax, and returns the CPU's.
std::pair<std::vector<float>, std::vector<int64_t>> expect_max_pool_matches(
    const Pool2dGeometry& g, const std::vector<float>& x) {
  std::vector<float> y(size_t(g.planes * g.ho * g.wo)), want(y.size());
  std::vector<int64_t> argmax(y.size()), want_argmax(y.size());
  Cu::max_pool2d<float>(g, x.data(), y.data(), argmax.data(), {});
  Cpu::max_pool2d<float>(g, x.data(), want.data(), want_argmax.data(), {});
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_TRUE(y[i] == want[i] || (std::isnan(y[i]) && std::isnan(want[i])))
        << "element " << i << " is " << y[i] << ", expected " << want[i];
  }
  EXPECT_EQ(argmax, want_argmax);
  return {want, want_argmax};
}

TEST(EmuPool, MaxPoolPropagatesNanAndMatchesCpu) {
  const Pool2dGeometry g = geometry(2, 5, 7, {3, 3}, {2, 2}, {1, 1});
  auto x = random_values<float>(g.planes * g.h * g.w, 9);
  x[8] = std::numeric_limits<float>::quiet_NaN();
  x[9] = std::numeric_limits<float>::quiet_NaN();
  x[40] = std::numeric_limits<float>::infinity();
  const auto [y, argmax] = expect_max_pool_matches(g, x);
  EXPECT_TRUE(std::isnan(y[0]));
}

// The CPU's branch-free 2x2/stride-2 path (kernels/cpu/pool.cpp) keeps the general rules: the
// first maximum on ties, the first NaN wins, infinities compare as usual.
TEST(EmuPool, TwoByTwoMaxPoolKeepsTheFirstMaximumAndTheFirstNan) {
  const Pool2dGeometry g = geometry(2, 4, 6, {2, 2}, {2, 2}, {0, 0});
  auto x = random_values<float>(g.planes * g.h * g.w, 11);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  x[0] = 5.0f, x[1] = 5.0f, x[6] = 5.0f, x[7] = 5.0f;  // a window of ties: index 0 wins
  x[3] = nan, x[9] = nan;                              // NaN second in scan order, then a NaN
  x[4] = -inf, x[5] = -inf, x[10] = -inf, x[11] = -inf;
  x[13] = inf, x[19] = inf;  // two +inf: the first wins
  x[26] = nan;               // NaN first in its window
  const auto [y, argmax] = expect_max_pool_matches(g, x);
  EXPECT_EQ(argmax[0], 0);
  EXPECT_EQ(argmax[1], 3);
  EXPECT_EQ(argmax[2], 4);
  EXPECT_TRUE(std::isnan(y[1]));
}

TEST(EmuPool, AvgPoolForwardBackwardMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto& g : geometries()) {
      check_avg_pool<T>(g, true);
      check_avg_pool<T>(g, false);
    }
  });
}

TEST(EmuPool, AdaptiveAvgPool1x1ForwardBackwardMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (int64_t hw : kAwkwardSizes) {
      for (int64_t planes : {int64_t(1), int64_t(3), int64_t(33)}) {
        const std::string what = ::rg::detail::cat(type_name<T>(), " planes=", planes, " hw=", hw);
        const auto x = random_values<T>(planes * hw, uint64_t(planes * hw + 1));
        std::vector<T> y(static_cast<size_t>(planes));
        Cu::adaptive_avg_pool2d_1x1<T>(x.data(), y.data(), planes, hw, {});
        std::vector<ref_t<T>> want(y.size());
        Cpu::adaptive_avg_pool2d_1x1<ref_t<T>>(convert_all<ref_t<T>>(x).data(), want.data(), planes,
                                               hw, {});
        expect_close(y, want, atol<T>(), default_rtol<T>(), "adaptive_avg_pool2d 1x1 " + what);

        const auto gy = random_values<T>(planes, uint64_t(planes + 2));
        std::vector<T> gx(x.size());
        Cu::adaptive_avg_pool2d_1x1_backward<T>(gy.data(), gx.data(), planes, hw, {});
        std::vector<ref_t<T>> want_gx(gx.size());
        Cpu::adaptive_avg_pool2d_1x1_backward<ref_t<T>>(convert_all<ref_t<T>>(gy).data(),
                                                        want_gx.data(), planes, hw, {});
        expect_close(gx, want_gx, atol<T>(), default_rtol<T>(),
                     "adaptive_avg_pool2d 1x1 backward " + what);
      }
    }
  });
}

// Both backends sum a plane in f64: 2^24 followed by ones loses every one in f32 (2^24 + 1 rounds
// back to 2^24), in any order; in f64 the mean is exact before its one rounding, so the two
// backends agree bit for bit. Catches f32 accumulation on either side.
TEST(EmuPool, AdaptiveAvgPool1x1SumsInF64OnBothBackends) {
  for (int64_t hw : {int64_t(33), int64_t(1000), int64_t(4097)}) {
    std::vector<float> x(static_cast<size_t>(2 * hw), 1.f);
    x[0] = 16777216.f;                                // 2^24
    x[static_cast<size_t>(2 * hw - 1)] = 16777216.f;  // the last of plane 1
    const float want = static_cast<float>((16777216.0 + double(hw - 1)) / double(hw));
    std::vector<float> cu(2), cpu(2);
    Cu::adaptive_avg_pool2d_1x1<float>(x.data(), cu.data(), 2, hw, {});
    Cpu::adaptive_avg_pool2d_1x1<float>(x.data(), cpu.data(), 2, hw, {});
    for (int p = 0; p < 2; ++p) {
      EXPECT_EQ(cu[p], want) << "CUDA plane " << p << " hw=" << hw;
      EXPECT_EQ(cpu[p], want) << "CPU plane " << p << " hw=" << hw;
    }
  }
}

// The same geometry checks on both backends (the CPU kernels used to trust their caller).
template <class K>
void check_rejects_bad_geometry(const char* backend) {
  SCOPED_TRACE(backend);
  std::vector<float> x(64), y(64);
  std::vector<int64_t> argmax(64);
  Pool2dGeometry g = geometry(1, 4, 4, {2, 2}, {2, 2}, {0, 0});
  g.ho = 3;  // not floor((4 - 2) / 2) + 1
  EXPECT_THROW(K::template max_pool2d<float>(g, x.data(), y.data(), argmax.data(), {}), Error);
  EXPECT_THROW(K::template max_pool2d_backward<float>(g, y.data(), argmax.data(), x.data(), {}),
               Error);
  g = geometry(1, 4, 4, {2, 2}, {2, 2}, {0, 0});
  g.ph = 2;  // more than half the kernel
  EXPECT_THROW(K::template avg_pool2d<float>(g, x.data(), y.data(), true, {}), Error);
  g = geometry(1, 4, 4, {2, 2}, {2, 2}, {0, 0});
  g.sh = 0;
  EXPECT_THROW(K::template avg_pool2d_backward<float>(g, x.data(), y.data(), true, {}), Error);
  g = geometry(1, 4, 4, {2, 2}, {2, 2}, {0, 0});
  g.kw = 5;  // larger than the input
  EXPECT_THROW(K::template avg_pool2d<float>(g, x.data(), y.data(), false, {}), Error);
  EXPECT_THROW(K::template adaptive_avg_pool2d_1x1<float>(x.data(), y.data(), 2, 0, {}), Error);
  EXPECT_THROW(K::template adaptive_avg_pool2d_1x1_backward<float>(x.data(), y.data(), -1, 4, {}),
               Error);
  // No planes: nothing to do, and nothing read.
  g = geometry(0, 4, 4, {2, 2}, {2, 2}, {0, 0});
  EXPECT_NO_THROW(K::template max_pool2d<float>(g, nullptr, nullptr, nullptr, {}));
  EXPECT_NO_THROW(K::template adaptive_avg_pool2d_1x1<float>(nullptr, nullptr, 0, 4, {}));
}

TEST(EmuPool, RejectsBadGeometryOnBothBackends) {
  check_rejects_bad_geometry<Cu>("CUDA");
  check_rejects_bad_geometry<Cpu>("CPU");
}

}  // namespace
}  // namespace rg::emu_kernel_test
