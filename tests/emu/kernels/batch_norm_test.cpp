// kernels/batch_norm.h: BatchNorm<Cuda> (kernels/cuda/batch_norm.cu under the CUDA emulator)
// against BatchNorm<Cpu> on the same arguments: per-channel statistics, normalize + affine,
// running-stat update and the backward, in f32, f64, f16 and bf16 (the CPU kernel in f32 on the
// converted half inputs), awkward sizes; f64 statistics on both; bit-identical reruns.
#include "kernels/batch_norm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

using Cu = kernels::BatchNorm<kernels::Cuda>;
using Cpu = kernels::BatchNorm<kernels::Cpu>;

template <class F>
void for_each_type(F&& f) {
  for_each_float_type(f);
}

// (n, c, hw): channels of 1, 31, 33, 1000 and 4097 values, [N, C] inputs (hw = 1; also over
// several tiles of channels), many channels.
std::vector<std::array<int64_t, 3>> shapes() {
  std::vector<std::array<int64_t, 3>> s;
  for (int64_t hw : kAwkwardSizes) s.push_back({2, 3, hw});
  for (int64_t n : kAwkwardSizes) s.push_back({n, 5, 1});
  s.push_back({1, 33, 31});
  s.push_back({3, 1, 1000});
  // hw = 1 with tiles of 32 channels (channels-last batch norm's [N * H * W, C]): a partial tile,
  // rows not a multiple of the 8 a block reads at a time, and several slices.
  s.push_back({1000, 33, 1});
  s.push_back({4097, 70, 1});
  s.push_back({9, 64, 1});
  return s;
}

std::string describe(const char* op, const char* type, const std::array<int64_t, 3>& s) {
  return ::rg::detail::cat(op, " ", type, " [", s[0], ", ", s[1], ", ", s[2], "]");
}

constexpr double kEps = 1e-5;

// Scratch for one backend's stats/backward at these sizes (kept alive by the returned vector).
template <class K>
std::vector<unsigned char> scratch_for(int64_t n, int64_t c, int64_t hw) {
  return std::vector<unsigned char>(static_cast<size_t>(K::workspace_bytes(n, c, hw)));
}
inline kernels::Workspace ws(std::vector<unsigned char>& v) {
  return {v.data(), static_cast<int64_t>(v.size())};
}

// The CPU kernel's f64 statistics of x (f32 or f64: the reference type of the values).
struct Stats {
  std::vector<double> mean, var, invstd;
};

template <class R>
Stats cpu_stats(const std::vector<R>& x, int64_t n, int64_t c, int64_t hw) {
  Stats s{std::vector<double>(static_cast<size_t>(c)),
          std::vector<double>(static_cast<size_t>(c)),
          std::vector<double>(static_cast<size_t>(c))};
  Cpu::stats<R>(x.data(), n, c, hw, s.mean.data(), s.var.data(), s.invstd.data(), kEps, {}, {});
  return s;
}

template <class T>
void check_stats(const std::array<int64_t, 3>& shape) {
  const auto [n, c, hw] = shape;
  // Offset values: a large mean next to the spread is where one-pass variance would cancel.
  const auto x = random_values<T>(n * c * hw, uint64_t(n * c * hw + 1), 3.f, 7.f);
  std::vector<double> mean(static_cast<size_t>(c)), var(static_cast<size_t>(c)),
      invstd(static_cast<size_t>(c));
  auto scratch = scratch_for<Cu>(n, c, hw);
  Cu::stats<T>(x.data(), n, c, hw, mean.data(), var.data(), invstd.data(), kEps, ws(scratch), {});
  const Stats want = cpu_stats(convert_all<ref_t<T>>(x), n, c, hw);
  // f64 sums on both backends over the same values: only the summation order differs.
  expect_close(mean, want.mean, 1e-13, 1e-12,
               describe("batch_norm_stats mean", type_name<T>(), shape));
  expect_close(var, want.var, 1e-13, 1e-11,
               describe("batch_norm_stats var", type_name<T>(), shape));
  expect_close(invstd, want.invstd, 1e-13, 1e-11,
               describe("batch_norm_stats invstd", type_name<T>(), shape));
}

template <class T>
void check_apply(const std::array<int64_t, 3>& shape, bool affine, bool relu = false,
                 bool residual = false) {
  const auto [n, c, hw] = shape;
  const auto x = random_values<T>(n * c * hw, uint64_t(n * c * hw + 2));
  const auto weight = random_values<T>(c, uint64_t(c + 3), 0.5f, 1.5f);
  const auto bias = random_values<T>(c, uint64_t(c + 4));
  const auto r = random_values<T>(n * c * hw, uint64_t(n * c * hw + 9));
  const auto xf = convert_all<ref_t<T>>(x), rf = convert_all<ref_t<T>>(r);
  const Stats st = cpu_stats(xf, n, c, hw);
  std::vector<T> y(x.size());
  Cu::apply<T>(x.data(), n, c, hw, st.mean.data(), st.invstd.data(),
               affine ? weight.data() : nullptr, affine ? bias.data() : nullptr,
               residual ? r.data() : nullptr, relu, y.data(), {});
  const auto wf = convert_all<ref_t<T>>(weight), bf = convert_all<ref_t<T>>(bias);
  std::vector<ref_t<T>> want(x.size());
  Cpu::apply<ref_t<T>>(xf.data(), n, c, hw, st.mean.data(), st.invstd.data(),
                       affine ? wf.data() : nullptr, affine ? bf.data() : nullptr,
                       residual ? rf.data() : nullptr, relu, want.data(), {});
  expect_close(y, want, residual ? 2e-5 : 1e-5, default_rtol<T>(),
               describe(affine ? "batch_norm_apply affine" : "batch_norm_apply", type_name<T>(),
                        shape) +
                   (residual ? " + residual" : "") + (relu ? " relu" : ""));
  if (relu) {
    for (double v : convert_all<double>(y)) ASSERT_GE(v, 0.0);
  }
}

template <class T>
void check_backward(const std::array<int64_t, 3>& shape, bool affine, bool batch_stats,
                    bool relu = false, bool residual = false) {
  const auto [n, c, hw] = shape;
  const int64_t m = n * hw;
  const std::string what =
      ::rg::detail::cat(affine ? " affine" : "", batch_stats ? " batch_stats" : " running_stats",
                        residual ? " + residual" : "", relu ? " relu" : "");
  const auto r = random_values<T>(n * c * hw, uint64_t(n * c * hw + 10));
  const auto rf = convert_all<ref_t<T>>(r);
  const auto x = random_values<T>(n * c * hw, uint64_t(n * c * hw + 5));
  const auto gy = random_values<T>(n * c * hw, uint64_t(n * c * hw + 6));
  const auto weight = random_values<T>(c, uint64_t(c + 7), 0.5f, 1.5f);
  const auto bias = random_values<T>(c, uint64_t(c + 8));
  const auto xf = convert_all<ref_t<T>>(x), gyf = convert_all<ref_t<T>>(gy),
             wf = convert_all<ref_t<T>>(weight), bf = convert_all<ref_t<T>>(bias);
  const Stats st = cpu_stats(xf, n, c, hw);
  std::vector<T> gx(x.size()), gw(static_cast<size_t>(c)), gb(static_cast<size_t>(c)),
      gr(residual ? x.size() : 0), y(residual ? x.size() : 0);
  std::vector<ref_t<T>> want_gx(x.size()), want_gw(static_cast<size_t>(c)),
      want_gb(static_cast<size_t>(c)), want_gr(gr.size()), want_y(y.size());
  // With a residual the backward's relu mask comes from the forward's output: each backend's own.
  if (residual) {
    Cu::apply<T>(x.data(), n, c, hw, st.mean.data(), st.invstd.data(),
                 affine ? weight.data() : nullptr, affine ? bias.data() : nullptr, r.data(), relu,
                 y.data(), {});
    Cpu::apply<ref_t<T>>(xf.data(), n, c, hw, st.mean.data(), st.invstd.data(),
                         affine ? wf.data() : nullptr, affine ? bf.data() : nullptr, rf.data(),
                         relu, want_y.data(), {});
  }
  auto scratch = scratch_for<Cu>(n, c, hw);
  Cu::backward<T>(gy.data(), x.data(), n, c, hw, st.mean.data(), st.invstd.data(),
                  affine ? weight.data() : nullptr, affine ? bias.data() : nullptr,
                  residual ? y.data() : nullptr, batch_stats, relu, gx.data(), gw.data(),
                  gb.data(), residual ? gr.data() : nullptr, ws(scratch), {});
  Cpu::backward<ref_t<T>>(gyf.data(), xf.data(), n, c, hw, st.mean.data(), st.invstd.data(),
                          affine ? wf.data() : nullptr, affine ? bf.data() : nullptr,
                          residual ? want_y.data() : nullptr, batch_stats, relu, want_gx.data(),
                          want_gw.data(), want_gb.data(), residual ? want_gr.data() : nullptr, {},
                          {});
  if (residual) {  // gy or 0, by the same mask: equal unless a value sits at relu's threshold
    expect_close(gr, want_gr, 0, 0,
                 describe("batch_norm_backward gresidual", type_name<T>(), shape) + what);
  }
  // Sums over the m values of a channel carry m roundings of terms of size ~1.
  const double sum_atol = 2e-6 * double(m);
  expect_close(gb, want_gb, sum_atol, default_rtol<T>(),
               describe("batch_norm_backward gbias", type_name<T>(), shape) + what);
  expect_close(gw, want_gw, sum_atol, default_rtol<T>(),
               describe("batch_norm_backward gweight", type_name<T>(), shape) + what);
  // gx's terms scale with invstd (316 for a channel of one value, whose exact gx is 0).
  const double gx_atol = 1e-5 * *std::max_element(st.invstd.begin(), st.invstd.end());
  expect_close(gx, want_gx, gx_atol, std::max(default_rtol<T>(), 1e-4),
               describe("batch_norm_backward gx", type_name<T>(), shape) + what);
}

TEST(EmuBatchNorm, StatsMatchCpu) {
  for_each_type([]<class T>() {
    for (const auto& s : shapes()) check_stats<T>(s);
  });
}

TEST(EmuBatchNorm, ApplyMatchesCpu) {
  for_each_type([]<class T>() {
    for (const auto& s : shapes()) {
      check_apply<T>(s, true);
      check_apply<T>(s, false);
    }
  });
}

TEST(EmuBatchNorm, ApplyWithReluMatchesCpu) {
  for_each_type([]<class T>() {
    for (const auto& s : shapes()) {
      check_apply<T>(s, true, true);
      check_apply<T>(s, false, true);
    }
  });
}

// With a residual, f16/bf16 differ from the CPU's f32 reference where normalized + residual
// cancels to near 0 (the sign follows the rounding): f32 and f64 here, every type against the
// composition below.
TEST(EmuBatchNorm, ApplyWithResidualAndReluMatchesCpu) {
  for_types<float, double>([]<class T>() {
    for (const auto& s : shapes()) {
      check_apply<T>(s, true, true, true);
      check_apply<T>(s, false, false, true);
    }
  });
}

TEST(EmuBatchNorm, BackwardWithResidualAndReluMatchesCpu) {
  for_types<float, double>([]<class T>() {
    for (const auto& s : shapes()) {
      for (bool batch_stats : {true, false}) {
        check_backward<T>(s, true, batch_stats, true, true);
        check_backward<T>(s, false, batch_stats, false, true);
      }
    }
  });
}

// The fused kernels bit for bit the composition of this backend's own kernels: apply, then the
// add in compute precision rounded to T, then relu; backward's gresidual = gy where that output
// is positive (else 0), and gx = the plain backward of that masked gy.
template <class T>
void check_residual_composition(const std::array<int64_t, 3>& shape) {
  const auto [n, c, hw] = shape;
  const std::string what = describe("batch_norm + residual + relu", type_name<T>(), shape);
  const auto x = random_values<T>(n * c * hw, uint64_t(n * c * hw + 21));
  const auto r = random_values<T>(n * c * hw, uint64_t(n * c * hw + 22));
  const auto gy = random_values<T>(n * c * hw, uint64_t(n * c * hw + 23));
  const auto weight = random_values<T>(c, uint64_t(c + 24), 0.5f, 1.5f);
  const auto bias = random_values<T>(c, uint64_t(c + 25));
  const Stats st = cpu_stats(convert_all<ref_t<T>>(x), n, c, hw);
  std::vector<T> plain(x.size()), fused(x.size()), want(x.size());
  Cu::apply<T>(x.data(), n, c, hw, st.mean.data(), st.invstd.data(), weight.data(), bias.data(),
               nullptr, false, plain.data(), {});
  Cu::apply<T>(x.data(), n, c, hw, st.mean.data(), st.invstd.data(), weight.data(), bias.data(),
               r.data(), true, fused.data(), {});
  std::vector<T> masked(x.size());
  const auto wide = [](T v) { return kernels::cpu::convert<ref_t<T>>(v); };
  const T zero = kernels::cpu::convert<T>(0.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    const T pre = kernels::cpu::convert<T>(ref_t<T>(wide(plain[i]) + wide(r[i])));
    want[i] = wide(pre) < ref_t<T>(0) ? zero : pre;
    masked[i] = wide(pre) > ref_t<T>(0) ? gy[i] : zero;
  }
  expect_bits_equal(fused, want, what + " forward");
  auto scratch = scratch_for<Cu>(n, c, hw);
  const size_t cs = static_cast<size_t>(c);
  std::vector<T> gx(x.size()), gw(cs), gb(cs), gr(x.size());
  std::vector<T> want_gx(x.size()), want_gw(cs), want_gb(cs);
  Cu::backward<T>(gy.data(), x.data(), n, c, hw, st.mean.data(), st.invstd.data(), weight.data(),
                  bias.data(), fused.data(), true, true, gx.data(), gw.data(), gb.data(),
                  gr.data(), ws(scratch), {});
  Cu::backward<T>(masked.data(), x.data(), n, c, hw, st.mean.data(), st.invstd.data(),
                  weight.data(), bias.data(), nullptr, true, false, want_gx.data(),
                  want_gw.data(), want_gb.data(), nullptr, ws(scratch), {});
  expect_bits_equal(gr, masked, what + " gresidual");
  expect_bits_equal(gx, want_gx, what + " gx");
  expect_bits_equal(gw, want_gw, what + " gweight");
  expect_bits_equal(gb, want_gb, what + " gbias");
}

TEST(EmuBatchNorm, ResidualAndReluEqualTheCompositionBitForBit) {
  for_each_type([]<class T>() {
    for (const auto& s : shapes()) check_residual_composition<T>(s);
    check_residual_composition<T>({64, 2, 1024});  // sliced channels
  });
}

// f16/bf16 data with f32 parameters (P = float, autocast's BatchNorm2d): bit for bit the f32
// kernels on the data widened to f32, the results rounded once to T; the parameters' gradients
// are the f32 kernels' own.
template <class T>
void check_mixed(const std::array<int64_t, 3>& shape, bool relu) {
  const auto [n, c, hw] = shape;
  const std::string what =
      describe("batch_norm mixed", type_name<T>(), shape) + (relu ? " relu" : "");
  const auto x = random_values<T>(n * c * hw, uint64_t(n * c * hw + 31));
  const auto gy = random_values<T>(n * c * hw, uint64_t(n * c * hw + 32));
  const auto weight = random_values<float>(c, uint64_t(c + 33), 0.5f, 1.5f);
  const auto bias = random_values<float>(c, uint64_t(c + 34));
  const auto xf = widen(x), gyf = widen(gy);
  const Stats st = cpu_stats(xf, n, c, hw);
  std::vector<T> y(x.size()), gx(x.size());
  std::vector<float> y32(x.size()), gx32(x.size());
  Cu::apply<T, float>(x.data(), n, c, hw, st.mean.data(), st.invstd.data(), weight.data(),
                      bias.data(), nullptr, relu, y.data(), {});
  Cu::apply<float>(xf.data(), n, c, hw, st.mean.data(), st.invstd.data(), weight.data(),
                   bias.data(), nullptr, relu, y32.data(), {});
  expect_bits_equal(y, narrow<T>(y32), what + " forward");
  auto scratch = scratch_for<Cu>(n, c, hw);
  const size_t cs = static_cast<size_t>(c);
  std::vector<float> gw(cs), gb(cs), gw32(cs), gb32(cs);
  Cu::backward<T, float>(gy.data(), x.data(), n, c, hw, st.mean.data(), st.invstd.data(),
                         weight.data(), bias.data(), nullptr, true, relu, gx.data(), gw.data(),
                         gb.data(), nullptr, ws(scratch), {});
  Cu::backward<float>(gyf.data(), xf.data(), n, c, hw, st.mean.data(), st.invstd.data(),
                      weight.data(), bias.data(), nullptr, true, relu, gx32.data(), gw32.data(),
                      gb32.data(), nullptr, ws(scratch), {});
  expect_bits_equal(gx, narrow<T>(gx32), what + " gx");
  expect_bits_equal(gw, gw32, what + " gweight");
  expect_bits_equal(gb, gb32, what + " gbias");
}

TEST(EmuBatchNorm, HalfDataWithF32ParametersIsTheF32PathRoundedOnce) {
  for_types<Half, BFloat16>([]<class T>() {
    for (const auto& s : shapes()) {
      check_mixed<T>(s, false);
      check_mixed<T>(s, true);
    }
    check_mixed<T>({64, 2, 1024}, true);  // sliced channels
  });
}

TEST(EmuBatchNorm, BackwardMatchesCpu) {
  for_each_type([]<class T>() {
    for (const auto& s : shapes()) {
      for (bool affine : {true, false}) {
        for (bool batch_stats : {true, false}) check_backward<T>(s, affine, batch_stats);
      }
    }
  });
}

TEST(EmuBatchNorm, BackwardWithReluMatchesCpu) {
  for_each_type([]<class T>() {
    for (const auto& s : shapes()) {
      for (bool affine : {true, false}) {
        for (bool batch_stats : {true, false}) check_backward<T>(s, affine, batch_stats, true);
      }
    }
  });
}

// Many channels and images: several slices per channel (kernels/cuda/batch_norm.cu splits a
// channel's images over blocks when c is small), partials merged across slices.
TEST(EmuBatchNorm, SlicedChannelsMatchCpu) {
  const std::array<int64_t, 3> shape{64, 2, 1024};  // 8 slices per channel
  check_stats<float>(shape);
  check_stats<double>(shape);
  for (bool relu : {false, true}) {
    check_backward<float>(shape, true, true, relu);
    check_backward<double>(shape, true, true, relu);
  }
}

// More elements than one grid (kMaxBlocks = 4095 blocks of 256 threads, elementwise_common.cuh):
// the elementwise kernels' grid-stride loops go round again, and ChannelWalk must carry each
// index's position and channel across the wrap: stride 1048320 = 1048 * 1000 + 320, so positions
// from 680 on carry into the next row, and the channel moves by 1048 % 3 plus that carry.
TEST(EmuBatchNorm, ElementwiseKernelsTrackChannelsPastOneGrid) {
  const std::array<int64_t, 3> shape{400, 3, 1000};
  check_apply<float>(shape, true, true);
  check_backward<float>(shape, true, true, true);
  check_apply<float>(shape, true, true, true);
  check_backward<float>(shape, true, true, true, true);
}

TEST(EmuBatchNorm, BackwardWithoutGxOrParameterGrads) {
  const int64_t n = 3, c = 4, hw = 33;
  const auto x = random_values<float>(n * c * hw, 1);
  const auto gy = random_values<float>(n * c * hw, 2);
  const Stats st = cpu_stats(x, n, c, hw);
  std::vector<float> gx(x.size(), 7.f), gb(static_cast<size_t>(c));
  auto scratch = scratch_for<Cu>(n, c, hw);
  Cu::backward<float>(gy.data(), x.data(), n, c, hw, st.mean.data(), st.invstd.data(), nullptr,
                      nullptr, nullptr, true, false, nullptr, nullptr, gb.data(), nullptr,
                      ws(scratch), {});
  std::vector<float> want_gb(static_cast<size_t>(c));
  Cpu::backward<float>(gy.data(), x.data(), n, c, hw, st.mean.data(), st.invstd.data(), nullptr,
                       nullptr, nullptr, true, false, nullptr, nullptr, want_gb.data(), nullptr, {},
                       {});
  expect_close(gb, want_gb, 1e-6, 1e-6, "gbias only");
  Cu::backward<float>(gy.data(), x.data(), n, c, hw, st.mean.data(), st.invstd.data(), nullptr,
                      nullptr, nullptr, true, false, gx.data(), nullptr, nullptr, nullptr,
                      ws(scratch), {});
  EXPECT_NE(gx[0], 7.f);
}

TEST(EmuBatchNorm, UpdateRunningMatchesCpu) {
  for_each_type([]<class T>() {
    for (int64_t c : kAwkwardSizes) {
      const auto mean = convert_all<double>(random_values<float>(c, uint64_t(c + 1)));
      const auto var = convert_all<double>(random_values<float>(c, uint64_t(c + 2), 0.f, 3.f));
      const auto rm0 = random_values<T>(c, uint64_t(c + 3));
      const auto rv0 = random_values<T>(c, uint64_t(c + 4), 0.f, 3.f);
      for (int64_t count : {int64_t(1), int64_t(64)}) {
        auto rm = rm0, rv = rv0;
        Cu::update_running<T>(rm.data(), rv.data(), mean.data(), var.data(), c, count, 0.1, {});
        auto want_rm = convert_all<ref_t<T>>(rm0), want_rv = convert_all<ref_t<T>>(rv0);
        Cpu::update_running<ref_t<T>>(want_rm.data(), want_rv.data(), mean.data(), var.data(), c,
                                      count, 0.1, {});
        const std::string what = ::rg::detail::cat(type_name<T>(), " c=", c, " count=", count);
        expect_close(rm, want_rm, 1e-6, default_rtol<T>(), "running_mean " + what);
        expect_close(rv, want_rv, 1e-6, default_rtol<T>(), "running_var " + what);
        auto only_var = rv0;
        Cu::update_running<T>(nullptr, only_var.data(), mean.data(), var.data(), c, count, 0.1,
                              {});
        expect_close(only_var, want_rv, 1e-6, default_rtol<T>(), "running_var alone " + what);
      }
    }
  });
}

TEST(EmuBatchNorm, StatsAndBackwardAreDeterministic) {
  const int64_t n = 7, c = 3, hw = 4097;
  const auto x = random_values<float>(n * c * hw, 11, -50.f, 50.f);
  const auto gy = random_values<float>(n * c * hw, 12);
  std::array<std::vector<double>, 2> mean, var, invstd;
  std::array<std::vector<float>, 2> gw, gb;
  auto scratch = scratch_for<Cu>(n, c, hw);
  for (int run = 0; run < 2; ++run) {
    mean[run].resize(static_cast<size_t>(c));
    var[run].resize(static_cast<size_t>(c));
    invstd[run].resize(static_cast<size_t>(c));
    gw[run].resize(static_cast<size_t>(c));
    gb[run].resize(static_cast<size_t>(c));
    Cu::stats<float>(x.data(), n, c, hw, mean[run].data(), var[run].data(), invstd[run].data(),
                     kEps, ws(scratch), {});
    Cu::backward<float>(gy.data(), x.data(), n, c, hw, mean[run].data(), invstd[run].data(),
                        nullptr, nullptr, nullptr, true, false, nullptr, gw[run].data(),
                        gb[run].data(), nullptr, ws(scratch), {});
  }
  const size_t bytes = size_t(c) * sizeof(float);
  EXPECT_EQ(std::memcmp(mean[0].data(), mean[1].data(), 2 * bytes), 0);
  EXPECT_EQ(std::memcmp(var[0].data(), var[1].data(), 2 * bytes), 0);
  EXPECT_EQ(std::memcmp(gw[0].data(), gw[1].data(), bytes), 0);
  EXPECT_EQ(std::memcmp(gb[0].data(), gb[1].data(), bytes), 0);
}

// The statistics accumulate in f64 on both backends (CUDA used f32): a channel whose f32 sum
// would lose its small values to one large one gets the CPU's mean to the last bits of an f64.
TEST(EmuBatchNorm, StatisticsAccumulateInDoubleOnBothBackends) {
  const int64_t n = 1, c = 1, hw = 1 << 16;
  std::vector<float> x(size_t(hw), 1e-3f);
  x[0] = 4096.f;
  double mean = 0, var = 0, want_mean = 0, want_var = 0;
  auto scratch = scratch_for<Cu>(n, c, hw);
  Cu::stats<float>(x.data(), n, c, hw, &mean, &var, nullptr, kEps, ws(scratch), {});
  Cpu::stats<float>(x.data(), n, c, hw, &want_mean, &want_var, nullptr, kEps, {}, {});
  const double exact = (4096.0 + double(hw - 1) * double(1e-3f)) / double(hw);
  EXPECT_NEAR(want_mean, exact, 1e-15);
  EXPECT_NEAR(mean, exact, 1e-15);
  EXPECT_NEAR(var, want_var, 1e-12 * want_var);
}

TEST(EmuBatchNorm, RejectsBadArgumentsOnBothBackends) {
  std::vector<float> x(8);
  std::vector<double> mean(2), var(2);
  auto scratch = scratch_for<Cu>(2, 2, 2);
  const auto both = [&]<class K>() {
    EXPECT_THROW(K::template stats<float>(x.data(), 2, -2, 2, mean.data(), var.data(), nullptr,
                                          kEps, ws(scratch), {}),
                 Error);
    EXPECT_THROW(K::template stats<float>(x.data(), 2, 2, 2, mean.data(), var.data(), nullptr,
                                          -1.0, ws(scratch), {}),
                 Error);
  };
  both.template operator()<Cu>();
  both.template operator()<Cpu>();
  EXPECT_THROW(
      Cu::stats<float>(x.data(), 2, 2, 2, nullptr, var.data(), nullptr, kEps, ws(scratch), {}),
      Error);
  // CUDA's stats and backward need their workspace.
  std::vector<unsigned char> small(8);
  EXPECT_THROW(
      Cu::stats<float>(x.data(), 2, 2, 2, mean.data(), var.data(), nullptr, kEps, ws(small), {}),
      Error);
}

}  // namespace
}  // namespace rg::emu_kernel_test
