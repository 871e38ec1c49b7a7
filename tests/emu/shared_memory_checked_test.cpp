// The kernels that use shared memory (reductions, softmax and the losses, batch norm, pooling,
// argmax/top-k) once each in the checked emulator build (AddressSanitizer and bounds checks, see
// kernels/emu/cuda_emu.h), on small awkward shapes with partial blocks and warps: an out-of-bounds
// shared-memory access in any of them aborts this test. The full comparisons against the CPU are
// in tests/emu/kernels (too slow to run checked in CI: minutes per kernel family); the values
// here are checked against closed forms only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/batch_norm.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/half.h"
#include "kernels/loss.h"
#include "kernels/metrics.h"
#include "kernels/pool.h"
#include "kernels/reduce.h"

// The kernels here get plain host memory, read right after each launch: launches wait for their
// work, as with CUDA_LAUNCH_BLOCKING=1.
static const bool kLaunchBlocking = (rg::emu::set_launch_blocking(true), true);

namespace rg {
namespace {

using Loss = kernels::Loss<kernels::Cuda>;

std::vector<float> ramp(int64_t n) {  // distinct values, away from ties
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float((i * 37) % 101) / 50.f - 1.f;
  return v;
}

TEST(EmuChecked, Reductions) {
  for (int64_t n : {1, 33, 4097}) {
    const std::vector<float> ones(static_cast<size_t>(n), 1.f);
    using Reduce = kernels::Reduce<kernels::Cuda>;
    std::vector<unsigned char> ws(static_cast<size_t>(Reduce::sum_all_workspace_bytes(n)));
    float out = 0;
    Reduce::sum_all(ones.data(), n, &out, kernels::Workspace{ws.data(), int64_t(ws.size())}, {});
    EXPECT_EQ(out, float(n));
  }
  const int64_t outer = 2, r = 33, inner = 5;
  const std::vector<float> x(static_cast<size_t>(outer * r * inner), 2.f);
  std::vector<float> out(static_cast<size_t>(outer * inner));
  kernels::Reduce<kernels::Cuda>::sum_dim(x.data(), out.data(), outer, r, inner, {});
  for (float v : out) EXPECT_EQ(v, 2.f * float(r));
  kernels::Reduce<kernels::Cuda>::mean_dim(x.data(), out.data(), outer, r, inner, {});
  for (float v : out) EXPECT_FLOAT_EQ(v, 2.f);
}

TEST(EmuChecked, SoftmaxAndLosses) {
  for (const auto& [outer, c, inner] :
       std::vector<std::array<int64_t, 3>>{{3, 33, 1}, {2, 1000, 1}, {2, 7, 3}}) {
    const auto x = ramp(outer * c * inner);
    std::vector<float> y(x.size()), g(x.size(), 1.f), gx(x.size());
    Loss::softmax(x.data(), y.data(), outer, c, inner, {});
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        double s = 0;
        for (int64_t k = 0; k < c; ++k) s += y[size_t((o * c + k) * inner + i)];
        EXPECT_NEAR(s, 1.0, 1e-5);
      }
    }
    Loss::softmax_backward(g.data(), y.data(), gx.data(), outer, c, inner, {});
    for (float v : gx) EXPECT_NEAR(v, 0.f, 1e-6);  // softmax is invariant to a constant shift
    Loss::log_softmax(x.data(), y.data(), outer, c, inner, {});
    Loss::log_softmax_backward(g.data(), y.data(), gx.data(), outer, c, inner, {});
  }
  const int64_t n = 5, c = 33;
  const auto logits = ramp(n * c);
  std::vector<int64_t> target(n);
  std::iota(target.begin(), target.end(), 0);
  std::vector<float> lse(n), grad(static_cast<size_t>(n * c));
  std::vector<unsigned char> ws(static_cast<size_t>(Loss::cross_entropy_workspace_bytes(n)));
  float loss = 0, one = 1.f;
  int64_t bad[2] = {-1, -1};
  Loss::cross_entropy(logits.data(), target.data(), lse.data(), &loss, bad, n, c, 0.1,
                      kernels::Workspace{ws.data(), int64_t(ws.size())}, {});
  EXPECT_EQ(bad[0], n);
  EXPECT_EQ(bad[1], 0);
  EXPECT_TRUE(std::isfinite(loss));
  Loss::cross_entropy_backward(logits.data(), target.data(), lse.data(), &one, grad.data(), n, c,
                               0.1, {});
  for (int64_t i = 0; i < n; ++i) {  // each row of the gradient sums to 0
    double s = 0;
    for (int64_t j = 0; j < c; ++j) s += grad[size_t(i * c + j)];
    EXPECT_NEAR(s, 0.0, 1e-6);
  }
  Loss::nll_loss(logits.data(), target.data(), &loss, bad, n, c, {});
  Loss::nll_loss_backward(target.data(), &one, grad.data(), n, c, {});
  EXPECT_FLOAT_EQ(grad[0], -1.f / float(n));
}

TEST(EmuChecked, BatchNorm) {
  const int64_t n = 2, c = 3, hw = 33;
  const auto x = ramp(n * c * hw);
  using BatchNorm = kernels::BatchNorm<kernels::Cuda>;
  std::vector<double> mean(c), var(c), invstd(c);
  std::vector<float> y(x.size()), gx(x.size()), gw(c), gb(c);
  const std::vector<float> w(c, 1.f), b(c, 0.f), gy(x.size(), 1.f);
  std::vector<unsigned char> ws(static_cast<size_t>(BatchNorm::workspace_bytes(n, c, hw)));
  const kernels::Workspace workspace{ws.data(), int64_t(ws.size())};
  BatchNorm::stats(x.data(), n, c, hw, mean.data(), var.data(), invstd.data(), 1e-5, workspace,
                   {});
  BatchNorm::apply<float>(x.data(), n, c, hw, mean.data(), invstd.data(), w.data(), b.data(),
                          nullptr, true, y.data(), {});
  BatchNorm::backward<float>(gy.data(), x.data(), n, c, hw, mean.data(), invstd.data(), w.data(),
                             b.data(), nullptr, true, true, gx.data(), gw.data(), gb.data(),
                             nullptr, workspace, {});
  // With relu, gy counts where y > 0: for a ramp per image, half of each channel's values.
  for (size_t ch = 0; ch < gb.size(); ++ch) {
    float positive = 0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < hw; ++j) positive += y[size_t((i * c + int64_t(ch)) * hw + j)] > 0;
    }
    EXPECT_FLOAT_EQ(gb[ch], positive);
  }
  // With a residual (the output as relu's mask, the residual's gradient written), and bf16 data
  // with f32 parameters.
  std::vector<float> y2(x.size()), gr(x.size());
  const std::vector<float> r(x.size(), 0.25f);
  BatchNorm::apply<float>(x.data(), n, c, hw, mean.data(), invstd.data(), w.data(), b.data(),
                          r.data(), true, y2.data(), {});
  BatchNorm::backward<float>(gy.data(), x.data(), n, c, hw, mean.data(), invstd.data(), w.data(),
                             b.data(), y2.data(), true, true, gx.data(), gw.data(), gb.data(),
                             gr.data(), workspace, {});
  for (size_t i = 0; i < y2.size(); ++i) EXPECT_EQ(gr[i], y2[i] > 0 ? 1.f : 0.f) << i;
  std::vector<BFloat16> xh(x.size()), yh(x.size()), gyh(x.size(), float_to_bfloat16(1.f)), gxh(x.size());
  for (size_t i = 0; i < x.size(); ++i) xh[i] = float_to_bfloat16(x[i]);
  BatchNorm::apply<BFloat16, float>(xh.data(), n, c, hw, mean.data(), invstd.data(), w.data(),
                                    b.data(), nullptr, true, yh.data(), {});
  BatchNorm::backward<BFloat16, float>(gyh.data(), xh.data(), n, c, hw, mean.data(),
                                       invstd.data(), w.data(), b.data(), nullptr, true, true,
                                       gxh.data(), gw.data(), gb.data(), nullptr, workspace, {});
  for (size_t i = 0; i < yh.size(); ++i) EXPECT_GE(bfloat16_to_float(yh[i]), 0.f) << i;
}

TEST(EmuChecked, Pooling) {
  using Pool = kernels::Pool<kernels::Cuda>;
  const kernels::Pool2dGeometry g{3, 9, 11, 3, 3, 2, 2, 1, 1, 5, 6};
  const auto x = ramp(g.planes * g.h * g.w);
  std::vector<float> y(static_cast<size_t>(g.planes * g.ho * g.wo)), gx(x.size());
  std::vector<int64_t> argmax(y.size());
  Pool::max_pool2d(g, x.data(), y.data(), argmax.data(), {});
  Pool::max_pool2d_backward(g, y.data(), argmax.data(), gx.data(), {});
  Pool::avg_pool2d(g, x.data(), y.data(), true, {});
  Pool::avg_pool2d_backward(g, y.data(), gx.data(), false, {});
  std::vector<float> means(static_cast<size_t>(g.planes));
  Pool::adaptive_avg_pool2d_1x1(x.data(), means.data(), g.planes, g.h * g.w, {});
  Pool::adaptive_avg_pool2d_1x1_backward(means.data(), gx.data(), g.planes, g.h * g.w, {});
  EXPECT_FLOAT_EQ(gx[0], means[0] / float(g.h * g.w));
}

TEST(EmuChecked, ArgmaxAndTopk) {
  using Metrics = kernels::Metrics<kernels::Cuda>;
  const int64_t outer = 3, c = 1000;
  auto x = ramp(outer * c);
  for (int64_t o = 0; o < outer; ++o) x[size_t(o * c + 7 * o + 1)] = 5.f;
  std::vector<int64_t> idx(outer);
  Metrics::argmax(x.data(), idx.data(), outer, c, 1, {});
  for (int64_t o = 0; o < outer; ++o) EXPECT_EQ(idx[size_t(o)], 7 * o + 1);
  const std::vector<int64_t> target = {1, 8, 0};
  int64_t counts[2] = {-1, -1};  // hits, first row with an out-of-range target (none: outer)
  Metrics::topk_correct(x.data(), target.data(), outer, c, 1, counts, {});
  EXPECT_EQ(counts[0], 2);
  EXPECT_EQ(counts[1], outer);
}

}  // namespace
}  // namespace rg
