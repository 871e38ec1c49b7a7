// kernels/pool.h: Pool<Cuda> (kernels/cuda/pool.cu under the CUDA emulator) against Pool<Cpu> on
// the same arguments: max pooling (values, argmax indices, NaN), average pooling with and without
// count_include_pad and global average pooling, forward and backward, every storage type, awkward
// sizes; the shared geometry checks and global average pooling's f64 sums. Channels last: on each
// backend, the channels-last kernels against the NCHW kernels on the transposed data, bit for bit.
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

// Channels last (kernels/pool.h): x as [n, c, pixels] -> [n, pixels, c].
template <class T>
std::vector<T> to_channels_last(const std::vector<T>& v, int64_t n, int64_t c, int64_t pixels) {
  EXPECT_EQ(int64_t(v.size()), n * c * pixels);
  std::vector<T> out(v.size());
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t i = 0; i < pixels; ++i) {
        out[size_t((b * pixels + i) * c + ch)] = v[size_t((b * c + ch) * pixels + i)];
      }
    }
  }
  return out;
}

Pool2dGeometry channels_last(Pool2dGeometry g, int64_t c) {
  g.c = c;
  g.channels_last = true;
  return g;
}

// n * c planes: padding, stride != kernel, non-square inputs and kernels, overlapping windows, the
// CPU's 2x2 fast path (NCHW), and c = 70 across the CPU's 64-channel blocks.
std::vector<Pool2dGeometry> channels_last_geometries() {
  return {
      channels_last(geometry(1 * 1, 1, 31, {1, 3}, {1, 2}, {0, 1}), 1),
      channels_last(geometry(2 * 3, 5, 7, {3, 3}, {2, 2}, {1, 1}), 3),
      channels_last(geometry(1 * 70, 9, 8, {2, 2}, {2, 2}, {0, 0}), 70),
      channels_last(geometry(3 * 5, 17, 11, {3, 5}, {2, 3}, {1, 2}), 5),
      channels_last(geometry(2 * 33, 6, 10, {4, 4}, {1, 1}, {2, 2}), 33),
      channels_last(geometry(2 * 4, 40, 25, {3, 3}, {3, 3}, {0, 0}), 4),
  };
}

// Random values with ties (pairs of equal values), a few NaNs and infinities, and pairs of NaNs
// (a window's first NaN wins), for max pooling.
template <class T>
std::vector<T> values_with_ties_and_nans(int64_t count, uint64_t seed) {
  auto x = random_values<T>(count, seed);
  for (int64_t i = 0; i + 1 < count; i += 7) x[size_t(i + 1)] = x[size_t(i)];
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (int64_t i = 5; i < count; i += 97) x[size_t(i)] = kernels::cpu::convert<T>(specials[i % 3]);
  for (int64_t i = 40; i + 1 < count; i += 131) {
    x[size_t(i)] = x[size_t(i + 1)] = kernels::cpu::convert<T>(specials[0]);
  }
  return x;
}

// Max and average pooling (both divisors), forward and backward, of K in T: channels last gives the
// NCHW results transposed, bit for bit, and the same argmax indices.
template <class K, class T>
void check_channels_last_pool(const Pool2dGeometry& cl) {
  Pool2dGeometry g = cl;
  g.channels_last = false;
  const int64_t n = cl.planes / cl.c, c = cl.c;
  const int64_t in_n = g.planes * g.h * g.w, out_n = g.planes * g.ho * g.wo;
  const auto in_cl = [&](const auto& v) { return to_channels_last(v, n, c, g.h * g.w); };
  const auto out_cl = [&](const auto& v) { return to_channels_last(v, n, c, g.ho * g.wo); };
  const auto x = values_with_ties_and_nans<T>(in_n, uint64_t(in_n + 7));
  const auto x_avg = random_values<T>(in_n, uint64_t(in_n + 9));
  const auto gy = random_values<T>(out_n, uint64_t(out_n + 11));
  const std::string what = describe("", type_name<T>(), cl) + ::rg::detail::cat(" c=", c);

  std::vector<T> y(static_cast<size_t>(out_n)), y_cl(y.size());
  std::vector<int64_t> argmax(y.size()), argmax_cl(y.size());
  K::template max_pool2d<T>(g, x.data(), y.data(), argmax.data(), {});
  K::template max_pool2d<T>(cl, in_cl(x).data(), y_cl.data(), argmax_cl.data(), {});
  expect_bits_equal(y_cl, out_cl(y), "max_pool2d" + what);
  EXPECT_EQ(argmax_cl, out_cl(argmax)) << "max_pool2d argmax" << what;
  std::vector<T> gx(static_cast<size_t>(in_n)), gx_cl(gx.size());
  K::template max_pool2d_backward<T>(g, gy.data(), argmax.data(), gx.data(), {});
  K::template max_pool2d_backward<T>(cl, out_cl(gy).data(), argmax_cl.data(), gx_cl.data(), {});
  expect_bits_equal(gx_cl, in_cl(gx), "max_pool2d_backward" + what);

  for (bool include_pad : {true, false}) {
    const std::string mode = what + (include_pad ? " include_pad" : " exclude_pad");
    K::template avg_pool2d<T>(g, x_avg.data(), y.data(), include_pad, {});
    K::template avg_pool2d<T>(cl, in_cl(x_avg).data(), y_cl.data(), include_pad, {});
    expect_bits_equal(y_cl, out_cl(y), "avg_pool2d" + mode);
    K::template avg_pool2d_backward<T>(g, gy.data(), gx.data(), include_pad, {});
    K::template avg_pool2d_backward<T>(cl, out_cl(gy).data(), gx_cl.data(), include_pad, {});
    expect_bits_equal(gx_cl, in_cl(gx), "avg_pool2d_backward" + mode);
  }
}

TEST(EmuPool, ChannelsLastMatchesNchwBitForBitOnBothBackends) {
  for (const auto& g : channels_last_geometries()) {
    for_types<float, double>([&]<class T>() { check_channels_last_pool<Cpu, T>(g); });
    for_each_float_type([&]<class T>() { check_channels_last_pool<Cu, T>(g); });
  }
}

// A hand-checked case: one image, 2 channels of 2x2, a 2x2 window. Memory [h, w, c].
TEST(EmuPool, ChannelsLastMaxPoolByHand) {
  const Pool2dGeometry g = channels_last(geometry(2, 2, 2, {2, 2}, {2, 2}, {0, 0}), 2);
  // channel 0: 1 4 / 3 4 (first maximum at 1); channel 1: 8 5 / 6 7 (at 0)
  const std::vector<float> x = {1, 8, 4, 5, 3, 6, 4, 7};
  const auto run = [&]<class K>() {
    std::vector<float> y(2), gx(8);
    std::vector<int64_t> argmax(2);
    K::template max_pool2d<float>(g, x.data(), y.data(), argmax.data(), {});
    EXPECT_EQ(y, (std::vector<float>{4, 8}));
    EXPECT_EQ(argmax, (std::vector<int64_t>{1, 0}));
    const std::vector<float> gy = {10, 20};
    K::template max_pool2d_backward<float>(g, gy.data(), argmax.data(), gx.data(), {});
    EXPECT_EQ(gx, (std::vector<float>{0, 20, 10, 0, 0, 0, 0, 0}));
  };
  run.operator()<Cpu>();
  run.operator()<Cu>();
}

// Global average pooling of n images of c channels, forward and backward: channels last on either
// backend gives the CPU's NCHW means bit for bit (both add in order in f64; CUDA's NCHW kernel adds
// as a block tree, so its f64 sums may differ in the last bit), and K's NCHW gradients transposed.
template <class K, class T>
void check_channels_last_global_pool(int64_t n, int64_t c, int64_t hw) {
  const std::string what = ::rg::detail::cat(type_name<T>(), " n=", n, " c=", c, " hw=", hw);
  const auto x = random_values<T>(n * c * hw, uint64_t(n * c * hw + 13));
  std::vector<ref_t<T>> want(static_cast<size_t>(n * c));
  Cpu::adaptive_avg_pool2d_1x1<ref_t<T>>(widen(x).data(), want.data(), n * c, hw, {});
  std::vector<T> y(want.size());
  K::template adaptive_avg_pool2d_1x1_channels_last<T>(to_channels_last(x, n, c, hw).data(),
                                                       y.data(), n, c, hw, {});
  expect_bits_equal(y, narrow<T>(want), "adaptive_avg_pool2d_1x1_channels_last " + what);

  const auto gy = random_values<T>(n * c, uint64_t(n * c + 17));
  std::vector<T> gx(x.size()), gx_cl(x.size());
  K::template adaptive_avg_pool2d_1x1_backward<T>(gy.data(), gx.data(), n * c, hw, {});
  K::template adaptive_avg_pool2d_1x1_channels_last_backward<T>(gy.data(), gx_cl.data(), n, c, hw,
                                                                {});
  expect_bits_equal(gx_cl, to_channels_last(gx, n, c, hw),
                    "adaptive_avg_pool2d_1x1_channels_last_backward " + what);
}

TEST(EmuPool, ChannelsLastAdaptiveAvgPool1x1MatchesNchwBitForBit) {
  for (int64_t hw : kAwkwardSizes) {
    for (auto [n, c] : {std::pair<int64_t, int64_t>{1, 1}, {2, 3}, {2, 70}}) {
      for_types<float, double>(
          [&]<class T>() { check_channels_last_global_pool<Cpu, T>(n, c, hw); });
      for_each_float_type([&]<class T>() { check_channels_last_global_pool<Cu, T>(n, c, hw); });
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

// Channels last needs c > 0 dividing planes, on every 2-D kernel; global pooling checks n, c, hw.
template <class K>
void check_rejects_bad_channels_last(const char* backend) {
  SCOPED_TRACE(backend);
  std::vector<float> x(256), y(256);
  std::vector<int64_t> argmax(256);
  for (int64_t c : {int64_t(4), int64_t(0), int64_t(-2)}) {
    SCOPED_TRACE(c);
    const Pool2dGeometry g = channels_last(geometry(6, 4, 4, {2, 2}, {2, 2}, {0, 0}), c);
    EXPECT_THROW(K::template max_pool2d<float>(g, x.data(), y.data(), argmax.data(), {}), Error);
    EXPECT_THROW(K::template max_pool2d_backward<float>(g, y.data(), argmax.data(), x.data(), {}),
                 Error);
    EXPECT_THROW(K::template avg_pool2d<float>(g, x.data(), y.data(), true, {}), Error);
    EXPECT_THROW(K::template avg_pool2d_backward<float>(g, y.data(), x.data(), false, {}), Error);
  }
  try {
    const Pool2dGeometry g = channels_last(geometry(6, 4, 4, {2, 2}, {2, 2}, {0, 0}), 4);
    K::template max_pool2d<float>(g, x.data(), y.data(), argmax.data(), {});
    ADD_FAILURE() << "no error for planes = 6, c = 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("channels last"), std::string::npos) << e.what();
  }
  // c = 3 divides 6 planes: accepted; c is ignored in NCHW.
  EXPECT_NO_THROW(
      K::template max_pool2d<float>(channels_last(geometry(6, 4, 4, {2, 2}, {2, 2}, {0, 0}), 3),
                                    x.data(), y.data(), argmax.data(), {}));
  using F = float;
  EXPECT_THROW(
      K::template adaptive_avg_pool2d_1x1_channels_last<F>(x.data(), y.data(), 2, 3, 0, {}), Error);
  EXPECT_THROW(
      K::template adaptive_avg_pool2d_1x1_channels_last<F>(x.data(), y.data(), 2, -1, 4, {}),
      Error);
  EXPECT_THROW(K::template adaptive_avg_pool2d_1x1_channels_last_backward<F>(x.data(), y.data(), -1,
                                                                             3, 4, {}),
               Error);
  EXPECT_NO_THROW(
      K::template adaptive_avg_pool2d_1x1_channels_last<F>(nullptr, nullptr, 0, 3, 4, {}));
  EXPECT_NO_THROW(
      K::template adaptive_avg_pool2d_1x1_channels_last_backward<F>(nullptr, nullptr, 2, 0, 4, {}));
}

TEST(EmuPool, ChannelsLastRejectsBadSizesOnBothBackends) {
  check_rejects_bad_channels_last<Cu>("CUDA");
  check_rejects_bad_channels_last<Cpu>("CPU");
}

TEST(EmuPool, RejectsBadGeometryOnBothBackends) {
  check_rejects_bad_geometry<Cu>("CUDA");
  check_rejects_bad_geometry<Cpu>("CPU");
}

}  // namespace
}  // namespace rg::emu_kernel_test
