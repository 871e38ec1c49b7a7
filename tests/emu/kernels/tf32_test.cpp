// TF32 in the emulated cuBLAS and cuDNN (kernels/emu/tf32.h): the rounding itself, and that a TF32
// GEMM or convolution is exactly the f32 one on TF32-rounded inputs while the f32 math modes stay
// f32 bit for bit, so the device tests see on the emulator the error a real tensor core makes.
#include "kernels/emu/tf32.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "kernels/conv2d.h"
#include "kernels/gemm.h"

namespace rg::emu_kernel_test {
namespace {

TEST(Tf32, RoundsToTenMantissaBitsNearestTiesAway) {
  const float ulp = std::ldexp(1.f, -10);  // TF32's spacing in [1, 2)
  EXPECT_EQ(emu::round_to_tf32(1.f), 1.f);
  EXPECT_EQ(emu::round_to_tf32(1.f + ulp), 1.f + ulp);
  EXPECT_EQ(emu::round_to_tf32(1.f + ulp / 4), 1.f);            // below half: down
  EXPECT_EQ(emu::round_to_tf32(1.f + 3 * ulp / 4), 1.f + ulp);  // above half: up
  EXPECT_EQ(emu::round_to_tf32(1.f + ulp / 2), 1.f + ulp);      // a tie: away from zero
  EXPECT_EQ(emu::round_to_tf32(-1.f - ulp / 2), -1.f - ulp);    // also for negatives
  EXPECT_EQ(emu::round_to_tf32(1.f + ulp + ulp / 2), 1.f + 2 * ulp);
  EXPECT_EQ(emu::round_to_tf32(0.f), 0.f);
  EXPECT_TRUE(std::signbit(emu::round_to_tf32(-0.f)));
  EXPECT_EQ(emu::round_to_tf32(FLT_MAX), INFINITY);  // past TF32's largest finite value
  EXPECT_EQ(emu::round_to_tf32(-INFINITY), -INFINITY);
  EXPECT_TRUE(std::isnan(emu::round_to_tf32(NAN)));
  // Subnormals keep the top 10 bits of the mantissa field too: 2^-136 is its bit 13, the lowest
  // kept; 2^-137 is half of it (a tie, away from zero) and 2^-138 less than half.
  EXPECT_EQ(emu::round_to_tf32(std::ldexp(1.f, -130) + std::ldexp(1.f, -149)),
            std::ldexp(1.f, -130));
  EXPECT_EQ(emu::round_to_tf32(std::ldexp(1.f, -137)), std::ldexp(1.f, -136));
  EXPECT_EQ(emu::round_to_tf32(std::ldexp(1.f, -138)), 0.f);
}

std::vector<float> tf32_copy(std::vector<float> v) {
  emu::round_to_tf32(v.data(), v.size());
  return v;
}

TEST(Tf32, EmulatedCublasRoundsItsInputsOnlyWithTf32Compute) {
  const int64_t m = 37, n = 29, k = 300;
  const auto a = random_values<float>(m * k, 1), b = random_values<float>(k * n, 2);
  std::vector<float> f32(size_t(m * n)), tf32(size_t(m * n)), ref_f32(size_t(m * n)),
      ref_tf32(size_t(m * n));
  using Cpu = kernels::Gemm<kernels::Cpu>;
  using Cuda = kernels::Gemm<kernels::Cuda>;
  Cpu::gemm(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.0, ref_f32.data(), n, false, {},
            {});
  Cpu::gemm(false, false, m, n, k, 1.0, tf32_copy(a).data(), k, tf32_copy(b).data(), n, 0.0,
            ref_tf32.data(), n, false, {}, {});
  Cuda::gemm(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.0, f32.data(), n,
             /*allow_tf32=*/false, {}, {});
  Cuda::gemm(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.0, tf32.data(), n,
             /*allow_tf32=*/true, {}, {});
  EXPECT_EQ(f32, ref_f32);
  EXPECT_EQ(tf32, ref_tf32);
  EXPECT_NE(tf32, f32);
}

TEST(Tf32, EmulatedCudnnConvolutionRoundsItsInputsOnlyInTheDefaultMathMode) {
  kernels::Conv2dGeometry g;
  g.n = 2, g.c = 5, g.h = 9, g.w = 8, g.o = 4, g.kh = 3, g.kw = 3;
  g.sh = 1, g.sw = 1, g.ph = 1, g.pw = 1, g.dh = 1, g.dw = 1, g.ho = 9, g.wo = 8;
  using Cpu = kernels::Conv2d<kernels::Cpu>;
  using Cuda = kernels::Conv2d<kernels::Cuda>;
  const auto x = random_values<float>(g.n * g.c * g.h * g.w, 3);
  const auto w = random_values<float>(g.o * g.c * g.kh * g.kw, 4);
  const auto gy = random_values<float>(g.n * g.o * g.ho * g.wo, 5);
  const size_t nx = x.size(), nw = w.size(), ny = gy.size();
  // What each device computes: y, gx, gw.
  struct Passes {
    std::vector<float> y, gx, gw;
  };
  auto on_cpu = [&](const std::vector<float>& xs, const std::vector<float>& ws,
                    const std::vector<float>& gys) {
    Passes p{std::vector<float>(ny), std::vector<float>(nx), std::vector<float>(nw)};
    Cpu::forward<float>(g, xs.data(), ws.data(), nullptr, p.y.data(), false, {}, {});
    Cpu::backward<float>(g, xs.data(), ws.data(), gys.data(), p.gx.data(), p.gw.data(), nullptr,
                         false, {}, {});
    return p;
  };
  auto on_emulated_cudnn = [&](bool allow_tf32) {
    Passes p{std::vector<float>(ny), std::vector<float>(nx), std::vector<float>(nw)};
    const auto bytes = [&](kernels::ConvPass pass) {
      return Cuda::workspace_bytes<float>(g, pass, allow_tf32, {});
    };
    std::vector<unsigned char> ws(
        size_t(std::max(bytes(kernels::ConvPass::forward), bytes(kernels::ConvPass::backward))));
    const kernels::Workspace scratch{ws.data(), int64_t(ws.size())};
    Cuda::forward<float>(g, x.data(), w.data(), nullptr, p.y.data(), allow_tf32, scratch, {});
    Cuda::backward<float>(g, x.data(), w.data(), gy.data(), p.gx.data(), p.gw.data(), nullptr,
                          allow_tf32, scratch, {});
    return p;
  };
  const Passes f32 = on_emulated_cudnn(false), tf32 = on_emulated_cudnn(true);
  const Passes ref_f32 = on_cpu(x, w, gy);
  const Passes ref_tf32 = on_cpu(tf32_copy(x), tf32_copy(w), tf32_copy(gy));
  EXPECT_EQ(f32.y, ref_f32.y);
  EXPECT_EQ(f32.gx, ref_f32.gx);
  EXPECT_EQ(f32.gw, ref_f32.gw);
  EXPECT_EQ(tf32.y, ref_tf32.y);
  EXPECT_EQ(tf32.gx, ref_tf32.gx);
  EXPECT_EQ(tf32.gw, ref_tf32.gw);
  EXPECT_NE(tf32.y, f32.y);
}

// NVIDIA_TF32_OVERRIDE=0 turns TF32 off in the libraries whatever the caller asks, as on a GPU.
TEST(Tf32, TheOverrideVariableTurnsItOff) {
  const int64_t m = 8, n = 8, k = 64;
  const auto a = random_values<float>(m * k, 6), b = random_values<float>(k * n, 7);
  std::vector<float> plain(size_t(m * n)), overridden(size_t(m * n));
  using Cuda = kernels::Gemm<kernels::Cuda>;
  Cuda::gemm(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.0, plain.data(), n, false, {},
             {});
  ASSERT_EQ(setenv("NVIDIA_TF32_OVERRIDE", "0", 1), 0);
  Cuda::gemm(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.0, overridden.data(), n,
             /*allow_tf32=*/true, {}, {});
  unsetenv("NVIDIA_TF32_OVERRIDE");
  EXPECT_EQ(overridden, plain);
}

}  // namespace
}  // namespace rg::emu_kernel_test
