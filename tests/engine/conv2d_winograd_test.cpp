// Our Winograd convolution (kernels/cpu/conv2d_winograd.h): its matrices against Lavin and Gray's
// published F(4x4, 3x3) constants, its three passes against an f64 reference on geometries that
// exercise partial tiles, padding 0-2, channel counts that are not multiples of 8 and several
// blocks of tiles, in both builds of the transforms (generic and AVX2 + FMA; each against the
// reference, as their roundings differ), the same bits at any thread count, and
// Conv2d<Cpu> taking it where it applies.
#include "kernels/cpu/conv2d_winograd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d_onednn.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/winograd_matrices.h"
#include "support/scaled_error.h"

namespace rg::kernels {
namespace {

namespace wm = cpu::winograd;

Conv2dGeometry geometry(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o, int64_t p) {
  return Conv2dGeometry{n, c, h, w, o, 3, 3, 1, 1, p, p, 1, 1, h + 2 * p - 2, w + 2 * p - 2};
}

std::vector<float> random(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

TEST(WinogradMatrices, F43IsLavinAndGraysAlgorithm) {
  // Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks" (2016), section 4.2.
  const double bt[36] = {4, 0,  -5, 0, 1, 0, 0, -4, -4, 1,  1, 0, 0, 4, -4, -1, 1, 0,
                         0, -2, -1, 2, 1, 0, 0, 2,  -1, -2, 1, 0, 0, 4, 0,  -5, 0, 1};
  const double g[18] = {1.0 / 4,  0,         0,        -1.0 / 6, -1.0 / 6, -1.0 / 6,
                        -1.0 / 6, 1.0 / 6,   -1.0 / 6, 1.0 / 24, 1.0 / 12, 1.0 / 6,
                        1.0 / 24, -1.0 / 12, 1.0 / 6,  0,        0,        1};
  const double at[24] = {1, 1, 1, 1, 1, 0, 0, 1, -1, 2, -2, 0,
                         0, 1, 1, 4, 4, 0, 0, 1, -1, 8, -8, 1};
  for (int i = 0; i < 36; ++i) EXPECT_EQ(wm::kF43.bt[size_t(i)], bt[i]) << "BT " << i;
  for (int i = 0; i < 18; ++i) EXPECT_NEAR(wm::kF43.g[size_t(i)], g[i], 1e-15) << "G " << i;
  for (int i = 0; i < 24; ++i) EXPECT_EQ(wm::kF43.at[size_t(i)], at[i]) << "AT " << i;
  EXPECT_EQ(wm::kF34.bt, wm::kF43.bt);  // the same points: the weight gradient shares BT
}

// AT [(G g) * (BT d)] is the correlation of d with g, for both algorithms.
template <int M, int R>
void check_correlation(const wm::Matrices<M, R>& w) {
  constexpr int n = M + R - 1;
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> dist(-1, 1);
  double d[n], g[R], gg[n], bd[n];
  for (double& v : d) v = dist(gen);
  for (double& v : g) v = dist(gen);
  for (int j = 0; j < n; ++j) {
    gg[j] = bd[j] = 0;
    for (int k = 0; k < R; ++k) gg[j] += w.g[size_t(j * R + k)] * g[k];
    for (int k = 0; k < n; ++k) bd[j] += w.bt[size_t(j * n + k)] * d[k];
  }
  for (int i = 0; i < M; ++i) {
    double y = 0, ref = 0;
    for (int j = 0; j < n; ++j) y += w.at[size_t(i * n + j)] * gg[j] * bd[j];
    for (int k = 0; k < R; ++k) ref += g[k] * d[i + k];
    EXPECT_NEAR(y, ref, 1e-12) << "F(" << M << ", " << R << ") output " << i;
  }
}

TEST(WinogradMatrices, ComputeCorrelations) {
  check_correlation(wm::kF43);
  check_correlation(wm::kF34);
}

struct Result {
  std::vector<double> y, gx, gw;
};

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// The three passes of the f64 im2col path (the reference) for random data of `g`.
Result reference(const Conv2dGeometry& g) {
  const auto x = widen(random(g.n * g.c * g.h * g.w, 1)), w = widen(random(g.o * g.c * 9, 2));
  const auto b = widen(random(g.o, 3)), gy = widen(random(g.n * g.o * g.ho * g.wo, 4));
  Result r{std::vector<double>(gy.size()), std::vector<double>(x.size()),
           std::vector<double>(w.size())};
  Conv2d<Cpu>::forward<double>(g, x.data(), w.data(), b.data(), r.y.data(), false, {}, {});
  Conv2d<Cpu>::backward<double>(g, x.data(), w.data(), gy.data(), r.gx.data(), r.gw.data(), nullptr,
                                false, {}, {});
  return r;
}

// [n][c][hw] -> [n][hw][c] (`back`: the reverse).
std::vector<float> permuted(const std::vector<float>& v, int64_t n, int64_t c, int64_t hw,
                            bool back = false) {
  std::vector<float> out(v.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < c; ++k) {
      for (int64_t p = 0; p < hw; ++p) {
        const int64_t first = (i * c + k) * hw + p, last = (i * hw + p) * c + k;
        out[size_t(back ? first : last)] = v[size_t(back ? last : first)];
      }
    }
  }
  return out;
}

// The same through our Winograd functions directly; `channels_last`: on NHWC copies of the same
// data (the results turned back to NCHW).
Result winograd(Conv2dGeometry g, bool channels_last = false) {
  auto x = random(g.n * g.c * g.h * g.w, 1), w = random(g.o * g.c * 9, 2);
  auto gy = random(g.n * g.o * g.ho * g.wo, 4);
  const auto b = random(g.o, 3);
  const int64_t hw = g.h * g.w, hwo = g.ho * g.wo;
  if (channels_last) {
    g.channels_last = true;
    x = permuted(x, g.n, g.c, hw);
    w = permuted(w, g.o, g.c, 9);
    gy = permuted(gy, g.n, g.o, hwo);
  }
  std::vector<float> y(gy.size()), gx(x.size()), gw(w.size());
  cpu::winograd_conv2d_forward(g, x.data(), w.data(), b.data(), y.data());
  cpu::winograd_conv2d_input_grad(g, w.data(), gy.data(), gx.data());
  cpu::winograd_conv2d_weight_grad(g, x.data(), gy.data(), gw.data());
  if (channels_last) {
    y = permuted(y, g.n, g.o, hwo, true);
    gx = permuted(gx, g.n, g.c, hw, true);
    gw = permuted(gw, g.o, g.c, 9, true);
  }
  return {widen(y), widen(gx), widen(gw)};
}

using test::scaled_error;

void expect_matches_reference(const Conv2dGeometry& g, double tolerance) {
  SCOPED_TRACE(::testing::Message() << "n" << g.n << " c" << g.c << " " << g.h << "x" << g.w << " o"
                                    << g.o << " p" << g.ph);
  ASSERT_TRUE(cpu::winograd_applies(g));
  const Result ref = reference(g);
  for (const bool channels_last : {false, true}) {
    SCOPED_TRACE(channels_last ? "channels last" : "contiguous");
    const Result got = winograd(g, channels_last);
    EXPECT_LE(scaled_error(got.y, ref.y), tolerance) << "y";
    EXPECT_LE(scaled_error(got.gx, ref.gx), tolerance) << "gx";
    EXPECT_LE(scaled_error(got.gw, ref.gw), tolerance) << "gw";
  }
}

class WinogradConv : public ::testing::TestWithParam<cpu::WinogradIsa> {
 protected:
  void SetUp() override {
    if (GetParam() == cpu::WinogradIsa::avx2 && !cpu::winograd_avx2_available()) {
      GTEST_SKIP() << "this CPU has no AVX2 + FMA";
    }
    cpu::set_winograd_isa(GetParam());
  }
  void TearDown() override { cpu::set_winograd_isa(cpu::WinogradIsa::automatic); }
};

TEST_P(WinogradConv, MatchesTheF64ReferenceOnAwkwardGeometries) {
  expect_matches_reference(geometry(2, 16, 9, 7, 17, 1), 1e-5);  // partial tiles, odd o
  expect_matches_reference(geometry(3, 17, 5, 6, 16, 0), 1e-5);  // no padding, odd c
  expect_matches_reference(geometry(1, 24, 4, 4, 32, 2), 1e-5);  // padding 2
  expect_matches_reference(geometry(2, 16, 1, 1, 16, 1), 1e-5);  // 1x1 images
  expect_matches_reference(geometry(3, 20, 12, 13, 24, 1), 1e-5);
  expect_matches_reference(geometry(9, 16, 40, 38, 16, 1), 1e-5);  // several blocks of tiles
  expect_matches_reference(geometry(1, 136, 7, 7, 72, 1), 1e-5);   // few tiles, many channels
  // Output channels in two uneven slices (36 x o x c floats > 8 MiB), over two blocks of tiles.
  expect_matches_reference(geometry(30, 200, 4, 4, 301, 1), 2e-5);  // long sums: 1.2e-5
}

// A ResNet-18 layer at its size on CIFAR (batch 64, 64 channels, 32x32): within 2e-5 of the
// output's scale (prints what it measured: about 8e-6 in y and gx, 6e-6 in gw, in both builds;
// the f32 im2col path is about 5e-7, oneDNN's Winograd 2e-6, 2e-6 and 7e-7).
TEST_P(WinogradConv, ResNetLayerStaysWithinFloatRounding) {
  const Conv2dGeometry g = geometry(64, 64, 32, 32, 64, 1);
  const Result ref = reference(g);
  for (const bool channels_last : {false, true}) {
    const Result got = winograd(g, channels_last);
    const double e[3] = {scaled_error(got.y, ref.y), scaled_error(got.gx, ref.gx),
                         scaled_error(got.gw, ref.gw)};
    std::printf("winograd%s y %.2e  gx %.2e  gw %.2e (error / scale)\n",
                channels_last ? " channels-last" : "", e[0], e[1], e[2]);
    for (double v : e) EXPECT_LE(v, 2e-5);
  }
}

TEST_P(WinogradConv, SameBitsAtAnyThreadCount) {
  const Conv2dGeometry g = geometry(5, 32, 17, 19, 24, 1);
  const int threads = cpu::num_threads();
  for (const bool channels_last : {false, true}) {
    cpu::set_num_threads(1);
    const Result one = winograd(g, channels_last);
    cpu::set_num_threads(3);
    const Result three = winograd(g, channels_last);
    cpu::set_num_threads(threads);
    EXPECT_EQ(one.y, three.y);
    EXPECT_EQ(one.gx, three.gx);
    EXPECT_EQ(one.gw, three.gw);
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, WinogradConv,
                         ::testing::Values(cpu::WinogradIsa::generic, cpu::WinogradIsa::avx2),
                         [](const auto& info) {
                           return std::string(info.param == cpu::WinogradIsa::avx2 ? "avx2"
                                                                                   : "generic");
                         });

TEST(WinogradConv, AppliesToStrideOne3x3LayersOnly) {
  EXPECT_TRUE(cpu::winograd_applies(geometry(1, 16, 8, 8, 16, 1)));
  EXPECT_FALSE(cpu::winograd_applies(geometry(1, 3, 8, 8, 16, 1)));  // too few channels
  Conv2dGeometry strided = geometry(1, 16, 8, 8, 16, 1);
  strided.sh = strided.sw = 2;
  EXPECT_FALSE(cpu::winograd_applies(strided));
  Conv2dGeometry dilated = geometry(1, 16, 8, 8, 16, 2);
  dilated.dh = dilated.dw = 2;
  EXPECT_FALSE(cpu::winograd_applies(dilated));
  EXPECT_FALSE(cpu::winograd_applies(geometry(0, 16, 8, 8, 16, 1)));
}

// Conv2d<Cpu>'s results y, gx, gw are those of calling our Winograd directly, bit for bit.
void expect_direct_calls_give(const Conv2dGeometry& g, const std::vector<float>& x,
                              const std::vector<float>& w, const std::vector<float>& b,
                              const std::vector<float>& gy, const std::vector<float>& y,
                              const std::vector<float>& gx, const std::vector<float>& gw) {
  std::vector<float> y_own(gy.size()), gx_own(x.size()), gw_own(w.size());
  cpu::winograd_conv2d_forward(g, x.data(), w.data(), b.data(), y_own.data());
  cpu::winograd_conv2d_input_grad(g, w.data(), gy.data(), gx_own.data());
  cpu::winograd_conv2d_weight_grad(g, x.data(), gy.data(), gw_own.data());
  EXPECT_EQ(y, y_own);
  EXPECT_EQ(gx, gx_own);
  EXPECT_EQ(gw, gw_own);
}

// With oneDNN off, Conv2d<Cpu> runs our Winograd for a layer it applies to (the same bits as
// calling it directly), gradients left null stay unwritten, and RG_CONV_ALGO=direct's switch
// gives the im2col path (different bits, same values within rounding).
TEST(WinogradConv, Conv2dCpuTakesItUnlessSwitchedOff) {
  const Conv2dGeometry g = geometry(2, 16, 9, 10, 16, 1);
  const auto x = random(g.n * g.c * g.h * g.w, 1), w = random(g.o * g.c * 9, 2);
  const auto b = random(g.o, 3), gy = random(g.n * g.o * g.ho * g.wo, 4);
  cpu::set_onednn_enabled(false);
  std::vector<float> y(gy.size()), gx(x.size(), 42.0f), gw(w.size(), 42.0f);
  Conv2d<Cpu>::forward<float>(g, x.data(), w.data(), b.data(), y.data(), false, {}, {});
  Conv2d<Cpu>::backward<float>(g, x.data(), w.data(), gy.data(), nullptr, gw.data(), nullptr, false,
                               {}, {});
  Conv2d<Cpu>::backward<float>(g, x.data(), w.data(), gy.data(), gx.data(), nullptr, nullptr, false,
                               {}, {});
  std::vector<float> y_direct(gy.size());
  cpu::set_winograd_enabled(false);
  Conv2d<Cpu>::forward<float>(g, x.data(), w.data(), b.data(), y_direct.data(), false, {}, {});
  cpu::set_winograd_enabled(true);
  cpu::set_onednn_enabled(true);
  expect_direct_calls_give(g, x, w, b, gy, y, gx, gw);
  EXPECT_NE(y, y_direct);
  EXPECT_LE(scaled_error(widen(y), widen(y_direct)), 1e-5);
}

// The same for a channels-last layer: with oneDNN off, Conv2d<Cpu> runs our channels-last
// Winograd (the same bits as calling it directly) and the NHWC bias gradient.
TEST(WinogradConv, Conv2dCpuTakesItForChannelsLastToo) {
  Conv2dGeometry g = geometry(2, 16, 9, 10, 24, 1);
  g.channels_last = true;
  const auto x = random(g.n * g.c * g.h * g.w, 1), w = random(g.o * g.c * 9, 2);
  const auto b = random(g.o, 3), gy = random(g.n * g.o * g.ho * g.wo, 4);
  cpu::set_onednn_enabled(false);
  std::vector<float> y(gy.size()), gx(x.size()), gw(w.size()), gb(b.size());
  Conv2d<Cpu>::forward<float>(g, x.data(), w.data(), b.data(), y.data(), false, {}, {});
  Conv2d<Cpu>::backward<float>(g, x.data(), w.data(), gy.data(), gx.data(), gw.data(), gb.data(),
                               false, {}, {});
  cpu::set_onednn_enabled(true);
  expect_direct_calls_give(g, x, w, b, gy, y, gx, gw);
  for (int64_t o = 0; o < g.o; ++o) {
    double sum = 0;
    for (int64_t i = 0; i < g.n * g.ho * g.wo; ++i) sum += gy[size_t(i * g.o + o)];
    EXPECT_NEAR(gb[size_t(o)], sum, 1e-4) << o;
  }
}

}  // namespace
}  // namespace rg::kernels
