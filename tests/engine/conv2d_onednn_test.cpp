// The f32 convolution through oneDNN (kernels/cpu/conv2d_onednn.h) against the im2col + GEMM path
// it replaces, on geometries that exercise its padding arithmetic (floored last windows: oneDNN's
// right padding), strides, dilation, 1x1 kernels, a missing bias and missing gradients, in NCHW
// and channels last.
#include "kernels/cpu/conv2d_onednn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/conv2d.h"
#include "kernels/cpu/conv2d_winograd.h"
#include "support/scaled_error.h"

namespace rg::kernels {
namespace {

Conv2dGeometry geometry(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o, int64_t k, int64_t s,
                        int64_t p, int64_t d) {
  Conv2dGeometry g{n, c, h, w, o, k, k, s, s, p, p, d, d, 0, 0};
  g.ho = (h + 2 * p - d * (k - 1) - 1) / s + 1;
  g.wo = (w + 2 * p - d * (k - 1) - 1) / s + 1;
  return g;
}

std::vector<float> random(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

// Largest |a - b| / (1 + |b|) over the elements.
double worst_error(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / (1.0 + std::abs(double(b[i]))));
  }
  return worst;
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_LE(worst_error(a, b), 1e-4) << what;
}

// Runs Conv2d<Cpu> with oneDNN on and off and compares every output.
void check(const Conv2dGeometry& g, bool bias) {
  SCOPED_TRACE(::testing::Message()
               << "n" << g.n << " c" << g.c << " " << g.h << "x" << g.w << " o" << g.o << " k"
               << g.kh << " s" << g.sh << " p" << g.ph << " d" << g.dh << (bias ? " bias" : ""));
  const auto x = random(g.n * g.c * g.h * g.w, 1), w = random(g.o * g.c * g.kh * g.kw, 2);
  const auto b = random(g.o, 3), gy = random(g.n * g.o * g.ho * g.wo, 4);
  struct Out {
    std::vector<float> y, gx, gw, gb;
  };
  auto run = [&](bool onednn) {
    cpu::set_onednn_enabled(onednn);
    Out o{std::vector<float>(gy.size()), std::vector<float>(x.size()), std::vector<float>(w.size()),
          std::vector<float>(b.size())};
    Conv2d<Cpu>::forward<float>(g, x.data(), w.data(), bias ? b.data() : nullptr, o.y.data(), false,
                                {}, {});
    Conv2d<Cpu>::backward<float>(g, x.data(), w.data(), gy.data(), o.gx.data(), o.gw.data(),
                                 o.gb.data(), false, {}, {});
    return o;
  };
  const Out ref = run(false), got = run(true);
  cpu::set_onednn_enabled(true);
  expect_close(got.y, ref.y, "y");
  expect_close(got.gx, ref.gx, "gx");
  expect_close(got.gw, ref.gw, "gw");
  EXPECT_EQ(got.gb, ref.gb);  // the bias gradient is ours on both paths (f64 sums)
}

TEST(Conv2dOneDnn, MatchesTheGemmPathOnAwkwardGeometries) {
  check(geometry(2, 3, 9, 7, 5, 3, 1, 1, 1), true);
  check(geometry(2, 3, 9, 7, 5, 3, 2, 1, 1), true);  // stride 2: the last window floored
  check(geometry(1, 4, 10, 11, 6, 3, 3, 0, 1), false);
  check(geometry(3, 2, 12, 12, 4, 3, 1, 2, 2), true);   // dilation 2
  check(geometry(2, 8, 5, 5, 16, 1, 1, 0, 1), true);    // 1x1
  check(geometry(2, 1, 28, 28, 32, 3, 1, 0, 1), true);  // ToyNet's conv1
  check(geometry(1, 3, 4, 4, 2, 5, 1, 2, 1), true);     // kernel larger than the image
}

// [a, b, hw] -> [a, hw, b]: NCHW to NHWC (and OIHW to OHWI); `back` the other way.
std::vector<float> to_last(const std::vector<float>& v, int64_t a, int64_t b, int64_t hw,
                           bool back = false) {
  std::vector<float> out(v.size());
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      for (int64_t p = 0; p < hw; ++p) {
        const int64_t first = (i * b + j) * hw + p, last = (i * hw + p) * b + j;
        out[size_t(back ? first : last)] = v[size_t(back ? last : first)];
      }
  return out;
}

// Channels last: oneDNN's NHWC convolution on our NHWC/OHWI arrays against the NCHW GEMM path on
// the same numbers; the bias gradient (ours, f64 sums in the same order) has the same bits.
TEST(Conv2dOneDnn, ChannelsLastRunsOnNhwcArraysAndMatchesTheGemmPath) {
  for (const Conv2dGeometry& g :
       {geometry(2, 3, 9, 7, 5, 3, 1, 1, 1), geometry(2, 3, 9, 7, 5, 3, 2, 1, 1),
        geometry(3, 2, 12, 12, 4, 3, 1, 2, 2), geometry(2, 8, 5, 5, 16, 1, 1, 0, 1),
        geometry(2, 16, 8, 8, 70, 3, 1, 1, 1)}) {  // 70 channels: two bias chunks
    SCOPED_TRACE(::testing::Message() << "n" << g.n << " c" << g.c << " " << g.h << "x" << g.w
                                      << " o" << g.o << " k" << g.kh << " s" << g.sh);
    const int64_t hw = g.h * g.w, hwo = g.ho * g.wo, k = g.kh * g.kw;
    const auto x = random(g.n * g.c * hw, 1), w = random(g.o * g.c * k, 2);
    const auto b = random(g.o, 3), gy = random(g.n * g.o * hwo, 4);
    std::vector<float> y(gy.size()), gx(x.size()), gw(w.size()), gb(b.size());
    cpu::set_onednn_enabled(false);
    Conv2d<Cpu>::forward<float>(g, x.data(), w.data(), b.data(), y.data(), false, {}, {});
    Conv2d<Cpu>::backward<float>(g, x.data(), w.data(), gy.data(), gx.data(), gw.data(), gb.data(),
                                 false, {}, {});
    cpu::set_onednn_enabled(true);
    Conv2dGeometry last = g;
    last.channels_last = true;
    const auto xl = to_last(x, g.n, g.c, hw), wl = to_last(w, g.o, g.c, k);
    const auto gyl = to_last(gy, g.n, g.o, hwo);
    std::vector<float> yl(y.size()), gxl(x.size()), gwl(w.size()), gbl(b.size());
    ASSERT_TRUE(cpu::onednn_conv2d_forward(last, xl.data(), wl.data(), b.data(), yl.data()))
        << "oneDNN took no channels-last convolution";
    std::fill(yl.begin(), yl.end(), 0.0f);
    Conv2d<Cpu>::forward<float>(last, xl.data(), wl.data(), b.data(), yl.data(), false, {}, {});
    Conv2d<Cpu>::backward<float>(last, xl.data(), wl.data(), gyl.data(), gxl.data(), gwl.data(),
                                 gbl.data(), false, {}, {});
    expect_close(to_last(yl, g.n, g.o, hwo, true), y, "y");
    expect_close(to_last(gxl, g.n, g.c, hw, true), gx, "gx");
    expect_close(to_last(gwl, g.o, g.c, k, true), gw, "gw");
    EXPECT_EQ(gbl, gb);
    // Without a bias, and each gradient alone (other primitives).
    std::vector<float> y0(y.size()), gx_only(x.size()), gw_only(w.size());
    Conv2d<Cpu>::forward<float>(last, xl.data(), wl.data(), nullptr, y0.data(), false, {}, {});
    Conv2d<Cpu>::backward<float>(last, xl.data(), wl.data(), gyl.data(), gx_only.data(), nullptr,
                                 nullptr, false, {}, {});
    Conv2d<Cpu>::backward<float>(last, xl.data(), wl.data(), gyl.data(), nullptr, gw_only.data(),
                                 nullptr, false, {}, {});
    std::vector<float> y_biased = to_last(y0, g.n, g.o, hwo, true);
    for (size_t i = 0; i < y_biased.size(); ++i) y_biased[i] += b[i / size_t(hwo) % size_t(g.o)];
    expect_close(y_biased, y, "y without bias, plus the bias");
    EXPECT_EQ(gx_only, gxl);
    EXPECT_EQ(gw_only, gwl);
  }
}

// The bias gradient's f64 sums on gy whose terms are small ones and +-2^60 that cancel (each sum
// depends on the order of its terms, down to its f32 rounding): channels last has the bits of NCHW,
// with images whose pixel count is not a multiple of the partial sums' 8 lanes and 70 channels (two
// chunks).
TEST(Conv2dOneDnn, ChannelsLastBiasGradientHasTheNchwBitsWhereTheOrderOfTermsMatters) {
  for (const Conv2dGeometry& g :
       {geometry(3, 4, 5, 7, 70, 1, 1, 0, 1), geometry(2, 4, 9, 9, 6, 3, 1, 1, 1)}) {
    const int64_t hw = g.h * g.w, hwo = g.ho * g.wo, k = g.kh * g.kw;
    const auto x = random(g.n * g.c * hw, 1), w = random(g.o * g.c * k, 2);
    // Per channel: terms in [1, 2), and a quarter of the places +2^60 or -2^60 in equal numbers,
    // so that the exact sum is that of the small terms, and an f64 sum keeps only those it adds
    // while its big terms cancel.
    std::mt19937 gen(5);
    std::uniform_real_distribution<float> small(1.0f, 2.0f);
    std::vector<float> gy(size_t(g.n * g.o * hwo));
    for (int64_t oc = 0; oc < g.o; ++oc) {
      std::vector<float> terms(size_t(g.n * hwo));
      for (size_t i = 0; i < terms.size(); ++i)
        terms[i] = i < terms.size() / 8 ? 0x1p60f : i < terms.size() / 4 ? -0x1p60f : small(gen);
      std::shuffle(terms.begin(), terms.end(), gen);
      for (int64_t s = 0; s < g.n; ++s)
        for (int64_t i = 0; i < hwo; ++i)
          gy[size_t((s * g.o + oc) * hwo + i)] = terms[size_t(s * hwo + i)];
    }
    std::vector<float> gx(x.size()), gw(w.size()), gb(size_t(g.o));
    cpu::set_onednn_enabled(false);
    Conv2d<Cpu>::backward<float>(g, x.data(), w.data(), gy.data(), gx.data(), gw.data(), gb.data(),
                                 false, {}, {});
    cpu::set_onednn_enabled(true);
    Conv2dGeometry last = g;
    last.channels_last = true;
    const auto xl = to_last(x, g.n, g.c, hw), wl = to_last(w, g.o, g.c, k);
    const auto gyl = to_last(gy, g.n, g.o, hwo);
    std::vector<float> gxl(x.size()), gwl(w.size()), gbl(size_t(g.o));
    Conv2d<Cpu>::backward<float>(last, xl.data(), wl.data(), gyl.data(), gxl.data(), gwl.data(),
                                 gbl.data(), false, {}, {});
    EXPECT_EQ(gbl, gb);
    // The data does tell orders apart: summed forwards and backwards, some channels differ.
    int differs = 0;
    for (int64_t oc = 0; oc < g.o; ++oc) {
      double forwards = 0, backwards = 0;
      for (int64_t j = 0; j < g.n * hwo; ++j) {
        const int64_t r = g.n * hwo - 1 - j;
        forwards += double(gy[size_t((j / hwo * g.o + oc) * hwo + j % hwo)]);
        backwards += double(gy[size_t((r / hwo * g.o + oc) * hwo + r % hwo)]);
      }
      differs += float(forwards) != float(backwards);
    }
    EXPECT_GT(differs, 0);
  }
}

// Every output of Conv2d<Cpu> in f32 for one geometry, with the path of `mode` ("gemm": oneDNN
// off; "direct" and "winograd": oneDNN's algorithms), and the same computed in f64 (GEMM path)
// as the reference.
struct Outputs {
  std::vector<double> y, gx, gw;
};
Outputs run_conv(const Conv2dGeometry& g, const std::string& mode) {
  const auto x = random(g.n * g.c * g.h * g.w, 1), w = random(g.o * g.c * g.kh * g.kw, 2);
  const auto gy = random(g.n * g.o * g.ho * g.wo, 4);
  auto widen = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  if (mode == "f64") {
    Outputs o{std::vector<double>(gy.size()), std::vector<double>(x.size()),
              std::vector<double>(w.size())};
    const auto xd = widen(x), wd = widen(w), gyd = widen(gy);
    Conv2d<Cpu>::forward<double>(g, xd.data(), wd.data(), nullptr, o.y.data(), false, {}, {});
    Conv2d<Cpu>::backward<double>(g, xd.data(), wd.data(), gyd.data(), o.gx.data(), o.gw.data(),
                                  nullptr, false, {}, {});
    return o;
  }
  cpu::set_onednn_enabled(mode != "gemm");
  cpu::set_winograd_enabled(mode == "winograd");
  std::vector<float> y(gy.size()), gx(x.size()), gw(w.size());
  Conv2d<Cpu>::forward<float>(g, x.data(), w.data(), nullptr, y.data(), false, {}, {});
  Conv2d<Cpu>::backward<float>(g, x.data(), w.data(), gy.data(), gx.data(), gw.data(), nullptr,
                               false, {}, {});
  cpu::set_onednn_enabled(true);
  cpu::set_winograd_enabled(true);
  return {widen(y), widen(gx), widen(gw)};
}

using test::scaled_error;

// A ResNet-18 3x3 layer at its real size (batch 64, 64 channels, 32x32), where oneDNN picks
// Winograd on AVX-512 machines: against an f64 reference, every output stays within 1e-5 of its
// scale (the f32 GEMM path: about 5e-7; measured on the AVX-512 EPYC: direct 4e-7, 4e-7, 7e-6
// for y, gx, gw (its weight gradient sums 65536 products in long chains); Winograd 1.8e-6,
// 2.1e-6, 7e-7). Prints what it measured.
TEST(Conv2dOneDnn, WinogradAndDirectStayWithinFloatRounding) {
  const Conv2dGeometry g = geometry(64, 64, 32, 32, 64, 3, 1, 1, 1);
  const Outputs ref = run_conv(g, "f64"), gemm = run_conv(g, "gemm");
  cpu::set_winograd_enabled(true);
  std::printf("oneDNN's forward for this layer with Winograd allowed: %s\n",
              cpu::onednn_forward_impl(g).c_str());
  for (const std::string mode : {"direct", "winograd"}) {
    const Outputs got = run_conv(g, mode);
    const double e[3] = {scaled_error(got.y, ref.y), scaled_error(got.gx, ref.gx),
                         scaled_error(got.gw, ref.gw)};
    const double base[3] = {scaled_error(gemm.y, ref.y), scaled_error(gemm.gx, ref.gx),
                            scaled_error(gemm.gw, ref.gw)};
    const char* names[3] = {"y", "gx", "gw"};
    for (int i = 0; i < 3; ++i) {
      std::printf("%-8s %-2s error / scale: %.2e (f32 GEMM path %.2e)\n", mode.c_str(), names[i],
                  e[i], base[i]);
      EXPECT_LE(e[i], 1e-5) << mode << " " << names[i];
    }
  }
}

TEST(Conv2dOneDnn, GradientsLeftNullAreNotWritten) {
  const Conv2dGeometry g = geometry(2, 3, 8, 8, 4, 3, 1, 1, 1);
  const auto x = random(g.n * g.c * g.h * g.w, 5), w = random(g.o * g.c * g.kh * g.kw, 6);
  const auto gy = random(g.n * g.o * g.ho * g.wo, 7);
  std::vector<float> gx(x.size(), 0.0f), gw(w.size(), 42.0f);
  Conv2d<Cpu>::backward<float>(g, x.data(), w.data(), gy.data(), gx.data(), nullptr, nullptr, false,
                               {}, {});
  std::vector<float> gw2(w.size(), 42.0f), gx2(x.size(), 42.0f);
  Conv2d<Cpu>::backward<float>(g, x.data(), w.data(), gy.data(), nullptr, gw2.data(), nullptr,
                               false, {}, {});
  EXPECT_EQ(gw, std::vector<float>(w.size(), 42.0f));
  EXPECT_EQ(gx2, std::vector<float>(x.size(), 42.0f));
  EXPECT_NE(gx, std::vector<float>(x.size(), 0.0f));
}

}  // namespace
}  // namespace rg::kernels
