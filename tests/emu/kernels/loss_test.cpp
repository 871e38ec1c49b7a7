// kernels/loss.h: Loss<Cuda> (kernels/cuda/loss.cu under the CUDA emulator) against Loss<Cpu> on
// the same arguments: softmax and log_softmax forward/backward along the last and inner
// dimensions, nll_loss and cross entropy (with label smoothing) forward/backward, every storage
// type, awkward sizes, and the shared contract for out-of-range targets.
#include "kernels/loss.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

using Cu = kernels::Loss<kernels::Cuda>;
using Cpu = kernels::Loss<kernels::Cpu>;

template <class T>
double atol() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}

// (outer, c, inner) shapes: rows of awkward lengths, and reductions over an inner dimension.
std::vector<std::array<int64_t, 3>> softmax_shapes() {
  std::vector<std::array<int64_t, 3>> shapes;
  for (int64_t c : kAwkwardSizes) {
    for (int64_t outer : {int64_t(1), int64_t(33)}) shapes.push_back({outer, c, 1});
    shapes.push_back({2, c, 5});
  }
  for (int64_t outer : kAwkwardSizes) shapes.push_back({outer, 10, 1});
  shapes.push_back({3, 31, 33});
  shapes.push_back({1, 7, 1000});
  return shapes;
}

std::string shape_str(const char* op, const char* type, const std::array<int64_t, 3>& s) {
  return ::rg::detail::cat(op, " ", type, " (", s[0], ", ", s[1], ", ", s[2], ")");
}

template <class T>
void check_log_softmax(const std::array<int64_t, 3>& shape) {
  const auto [outer, c, inner] = shape;
  const int64_t n = outer * c * inner;
  const auto x = random_values<T>(n, uint64_t(n + 11));
  std::vector<T> y(static_cast<size_t>(n));
  Cu::log_softmax<T>(x.data(), y.data(), outer, c, inner, {});
  std::vector<ref_t<T>> want(static_cast<size_t>(n));
  Cpu::log_softmax<ref_t<T>>(convert_all<ref_t<T>>(x).data(), want.data(), outer, c, inner, {});
  expect_close(y, want, atol<T>(), default_rtol<T>(),
               shape_str("log_softmax", type_name<T>(), shape));

  // Backward from the forward's stored output, as the engine saves it.
  const auto g = random_values<T>(n, uint64_t(n + 12));
  std::vector<T> gi(static_cast<size_t>(n));
  Cu::log_softmax_backward<T>(g.data(), y.data(), gi.data(), outer, c, inner, {});
  std::vector<ref_t<T>> want_gi(static_cast<size_t>(n));
  Cpu::log_softmax_backward<ref_t<T>>(convert_all<ref_t<T>>(g).data(),
                                      convert_all<ref_t<T>>(y).data(), want_gi.data(), outer, c,
                                      inner, {});
  expect_close(gi, want_gi, atol<T>(), default_rtol<T>(),
               shape_str("log_softmax_backward", type_name<T>(), shape));
}

template <class T>
void check_softmax(const std::array<int64_t, 3>& shape) {
  const auto [outer, c, inner] = shape;
  const int64_t n = outer * c * inner;
  const auto x = random_values<T>(n, uint64_t(n + 21));
  std::vector<T> y(static_cast<size_t>(n));
  Cu::softmax<T>(x.data(), y.data(), outer, c, inner, {});
  std::vector<ref_t<T>> want(static_cast<size_t>(n));
  Cpu::softmax<ref_t<T>>(convert_all<ref_t<T>>(x).data(), want.data(), outer, c, inner, {});
  expect_close(y, want, atol<T>() * 0.1, default_rtol<T>(),
               shape_str("softmax", type_name<T>(), shape));

  const auto g = random_values<T>(n, uint64_t(n + 22));
  std::vector<T> gi(static_cast<size_t>(n));
  Cu::softmax_backward<T>(g.data(), y.data(), gi.data(), outer, c, inner, {});
  std::vector<ref_t<T>> want_gi(static_cast<size_t>(n));
  Cpu::softmax_backward<ref_t<T>>(convert_all<ref_t<T>>(g).data(), convert_all<ref_t<T>>(y).data(),
                                  want_gi.data(), outer, c, inner, {});
  expect_close(gi, want_gi, atol<T>() * 0.1, default_rtol<T>(),
               shape_str("softmax_backward", type_name<T>(), shape));
}

// (n, c) shapes for the losses.
std::vector<std::array<int64_t, 2>> loss_shapes() {
  std::vector<std::array<int64_t, 2>> shapes;
  for (int64_t c : kAwkwardSizes) shapes.push_back({33, c});
  for (int64_t n : kAwkwardSizes) shapes.push_back({n, 10});
  return shapes;
}

template <class T>
void check_nll_loss(int64_t n, int64_t c) {
  const std::string what = ::rg::detail::cat(type_name<T>(), " n=", n, " c=", c);
  const auto lp = random_values<T>(n * c, uint64_t(n * 31 + c), -6.f, 0.f);
  const auto target = random_targets(n, c, uint64_t(n + c));
  std::vector<T> loss(1);
  int64_t bad[2] = {-1, -1}, want_bad[2] = {-1, -1};
  Cu::nll_loss<T>(lp.data(), target.data(), loss.data(), bad, n, c, {});
  const auto lpr = convert_all<ref_t<T>>(lp);
  std::vector<ref_t<T>> want(1);
  Cpu::nll_loss<ref_t<T>>(lpr.data(), target.data(), want.data(), want_bad, n, c, {});
  expect_close(loss, want, atol<T>(), default_rtol<T>(), "nll_loss " + what);
  EXPECT_EQ(bad[0], n) << what;
  EXPECT_EQ(want_bad[0], n) << what;
  EXPECT_EQ(bad[1], 0) << what;
  EXPECT_EQ(want_bad[1], 0) << what;

  const std::vector<T> grad_loss = {kernels::cpu::convert<T>(0.75f)};
  std::vector<T> gi(size_t(n * c));
  Cu::nll_loss_backward<T>(target.data(), grad_loss.data(), gi.data(), n, c, {});
  std::vector<ref_t<T>> want_gi(gi.size());
  const std::vector<ref_t<T>> grad_ref = convert_all<ref_t<T>>(grad_loss);
  Cpu::nll_loss_backward<ref_t<T>>(target.data(), grad_ref.data(), want_gi.data(), n, c, {});
  expect_close(gi, want_gi, 0.0, default_rtol<T>(), "nll_loss_backward " + what);
}

// A workspace of the size both backends ask for.
std::vector<unsigned char> loss_workspace(int64_t n) {
  EXPECT_EQ(Cu::cross_entropy_workspace_bytes(n), Cpu::cross_entropy_workspace_bytes(n));
  return std::vector<unsigned char>(size_t(Cu::cross_entropy_workspace_bytes(n)));
}
kernels::Workspace as_workspace(std::vector<unsigned char>& ws) {
  return {ws.data(), int64_t(ws.size())};
}

template <class T>
void check_cross_entropy(int64_t n, int64_t c, double eps) {
  const std::string what = ::rg::detail::cat(type_name<T>(), " n=", n, " c=", c, " eps=", eps);
  const auto x = random_values<T>(n * c, uint64_t(n * 37 + c), -4.f, 4.f);
  const auto target = random_targets(n, c, uint64_t(n + 2 * c));
  std::vector<T> lse(static_cast<size_t>(n)), loss(1);
  auto workspace = loss_workspace(n);
  int64_t bad[2] = {-1, -1}, want_bad[2] = {-1, -1};
  Cu::cross_entropy<T>(x.data(), target.data(), lse.data(), loss.data(), bad, n, c, eps,
                       as_workspace(workspace), {});
  const auto xr = convert_all<ref_t<T>>(x);
  std::vector<ref_t<T>> want_lse(static_cast<size_t>(n)), want(1);
  Cpu::cross_entropy<ref_t<T>>(xr.data(), target.data(), want_lse.data(), want.data(), want_bad, n,
                               c, eps, as_workspace(workspace), {});
  expect_close(lse, want_lse, atol<T>(), default_rtol<T>(), "cross_entropy lse " + what);
  expect_close(loss, want, atol<T>(), default_rtol<T>(), "cross_entropy " + what);
  EXPECT_EQ(bad[0], n) << what;
  EXPECT_EQ(want_bad[0], n) << what;
  EXPECT_EQ(bad[1], 0) << what;
  EXPECT_EQ(want_bad[1], 0) << what;

  // Backward from the forward's stored lse, as the engine saves it.
  const std::vector<T> grad_loss = {kernels::cpu::convert<T>(1.25f)};
  std::vector<T> gi(size_t(n * c));
  Cu::cross_entropy_backward<T>(x.data(), target.data(), lse.data(), grad_loss.data(), gi.data(), n,
                                c, eps, {});
  std::vector<ref_t<T>> want_gi(gi.size());
  const double scale = as_double(grad_loss[0]) / double(n);
  const std::vector<ref_t<T>> grad_ref = convert_all<ref_t<T>>(grad_loss);
  Cpu::cross_entropy_backward<ref_t<T>>(xr.data(), target.data(), convert_all<ref_t<T>>(lse).data(),
                                        grad_ref.data(), want_gi.data(), n, c, eps, {});
  // f16 results this small are subnormal: their spacing is 6e-8.
  expect_close(gi, want_gi, atol<T>() * scale + (std::is_same_v<T, Half> ? 6e-8 : 0.0),
               default_rtol<T>(), "cross_entropy_backward " + what);
}

TEST(EmuSoftmaxLoss, LogSoftmaxForwardBackwardMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto& shape : softmax_shapes()) check_log_softmax<T>(shape);
  });
}

TEST(EmuSoftmaxLoss, SoftmaxForwardBackwardMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto& shape : softmax_shapes()) check_softmax<T>(shape);
  });
}

TEST(EmuSoftmaxLoss, NllLossForwardBackwardMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto& [n, c] : loss_shapes()) check_nll_loss<T>(n, c);
  });
}

TEST(EmuSoftmaxLoss, CrossEntropyForwardBackwardMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto& [n, c] : loss_shapes()) check_cross_entropy<T>(n, c, 0.0);
  });
}

TEST(EmuSoftmaxLoss, CrossEntropyWithLabelSmoothingMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (double eps : {0.1, 1.0}) {
      for (const auto& [n, c] : loss_shapes()) check_cross_entropy<T>(n, c, eps);
    }
  });
}

// One contract for out-of-range targets on both backends: never read through, the row's loss
// NaN, first_bad the smallest such row (across blocks and threads on CUDA) with its target, and
// the backward leaves the row without a target term. (The CUDA kernels used to report nothing.)
TEST(EmuSoftmaxLoss, OutOfRangeTargetIsReportedTheSameOnBothBackends) {
  const int64_t n = 1500, c = 3;
  const auto x = random_values<float>(n * c, 9);
  for (const int64_t first : {int64_t(0), int64_t(1), int64_t(1025), n - 1}) {
    auto target = random_targets(n, c, 10);
    target[size_t(first)] = first % 2 == 0 ? c : -1;
    if (first + 7 < n) target[size_t(first + 7)] = 100;  // a later bad row does not win
    float loss = 0, want = 0;
    int64_t bad[2] = {-1, -1}, want_bad[2] = {-1, -1};
    Cu::nll_loss<float>(x.data(), target.data(), &loss, bad, n, c, {});
    Cpu::nll_loss<float>(x.data(), target.data(), &want, want_bad, n, c, {});
    EXPECT_TRUE(std::isnan(loss) && std::isnan(want)) << first;
    EXPECT_EQ(bad[0], first);
    EXPECT_EQ(want_bad[0], first);
    EXPECT_EQ(bad[1], target[size_t(first)]);  // the value travels with its row
    EXPECT_EQ(want_bad[1], target[size_t(first)]);
    std::vector<float> lse(static_cast<size_t>(n)), want_lse(static_cast<size_t>(n));
    auto workspace = loss_workspace(n);
    bad[0] = bad[1] = want_bad[0] = want_bad[1] = -1;
    Cu::cross_entropy<float>(x.data(), target.data(), lse.data(), &loss, bad, n, c, 0.1,
                             as_workspace(workspace), {});
    Cpu::cross_entropy<float>(x.data(), target.data(), want_lse.data(), &want, want_bad, n, c, 0.1,
                              as_workspace(workspace), {});
    EXPECT_TRUE(std::isnan(loss) && std::isnan(want)) << first;
    EXPECT_EQ(bad[0], first);
    EXPECT_EQ(want_bad[0], first);
    EXPECT_EQ(bad[1], target[size_t(first)]);
    EXPECT_EQ(want_bad[1], target[size_t(first)]);
    const float one = 1.f;
    std::vector<float> gi(size_t(n * c)), want_gi(size_t(n * c));
    Cu::cross_entropy_backward<float>(x.data(), target.data(), lse.data(), &one, gi.data(), n, c,
                                      0.1, {});
    Cpu::cross_entropy_backward<float>(x.data(), target.data(), want_lse.data(), &one,
                                       want_gi.data(), n, c, 0.1, {});
    expect_close(gi, std::vector<double>(want_gi.begin(), want_gi.end()), 1e-6, 1e-5,
                 "cross_entropy_backward with a bad target");
  }
}

// The mean over rows adds f64 per-row losses on both backends: an f32 loss of many rows whose
// f32 running sum would lose the small rows agrees with the CPU to the last bits.
TEST(EmuSoftmaxLoss, LossMeansAccumulateInDoubleOnBothBackends) {
  const int64_t n = 1 << 16, c = 2;
  std::vector<float> lp(size_t(n * c), -1e-6f);
  lp[0] = -4096.f;  // one large row: an f32 sum would swamp the 1e-6 ones after it
  const std::vector<int64_t> target(size_t(n), 0);
  float loss = 0, want = 0;
  int64_t bad[2] = {-1, -1};
  Cu::nll_loss<float>(lp.data(), target.data(), &loss, bad, n, c, {});
  Cpu::nll_loss<float>(lp.data(), target.data(), &want, bad, n, c, {});
  const double exact = (4096.0 + double(n - 1) * double(1e-6f)) / double(n);
  EXPECT_EQ(loss, want);
  EXPECT_EQ(loss, float(exact));
}

TEST(EmuSoftmaxLoss, LossesAreDeterministic) {
  const int64_t n = 4097, c = 33;
  const auto x = random_values<float>(n * c, 5, -10.f, 10.f);
  const auto target = random_targets(n, c, 6);
  auto workspace = loss_workspace(n);
  std::vector<float> lse(static_cast<size_t>(n));
  float a = 0, b = 0, na = 0, nb = 0;
  int64_t bad[2] = {0, 0};
  Cu::cross_entropy<float>(x.data(), target.data(), lse.data(), &a, bad, n, c, 0.1,
                           as_workspace(workspace), {});
  Cu::cross_entropy<float>(x.data(), target.data(), lse.data(), &b, bad, n, c, 0.1,
                           as_workspace(workspace), {});
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(float)), 0);
  Cu::nll_loss<float>(x.data(), target.data(), &na, bad, n, c, {});
  Cu::nll_loss<float>(x.data(), target.data(), &nb, bad, n, c, {});
  EXPECT_EQ(std::memcmp(&na, &nb, sizeof(float)), 0);
}

TEST(EmuSoftmaxLoss, RejectsBadArgumentsOnBothBackends) {
  std::vector<float> x(8), out(8), lse(2);
  const std::vector<int64_t> target = {0, 1};
  auto workspace = loss_workspace(2);
  int64_t bad[2] = {0, 0};
  const auto both = [&]<class K>() {
    EXPECT_THROW(K::template log_softmax<float>(x.data(), out.data(), 2, -1, 1, {}), Error);
    EXPECT_THROW(K::template nll_loss<float>(x.data(), target.data(), out.data(), bad, 2, 0, {}),
                 Error);
    EXPECT_THROW(K::template cross_entropy<float>(x.data(), target.data(), lse.data(), out.data(),
                                                  bad, 2, 4, 1.5, as_workspace(workspace), {}),
                 Error);
    EXPECT_THROW(K::template cross_entropy<float>(x.data(), target.data(), lse.data(), out.data(),
                                                  bad, 2, 4, 0.0, kernels::Workspace{}, {}),
                 Error);
  };
  both.template operator()<Cu>();
  both.template operator()<Cpu>();
}

}  // namespace
}  // namespace rg::emu_kernel_test
