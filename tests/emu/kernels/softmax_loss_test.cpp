// kernels/cuda/softmax_loss.cu under the CUDA emulator against kernels/cpu/softmax.h: softmax and
// log_softmax forward/backward along the last and inner dimensions, nll_loss and cross entropy
// (with label smoothing) forward/backward, every storage type, awkward sizes.
#include "kernels/cuda/softmax_loss.h"

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
#include "kernels/cpu/softmax.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

namespace cu = kernels::cuda;
namespace cpu = kernels::cpu;

template <class T>
double atol() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}

std::vector<int64_t> random_targets(int64_t n, int64_t c, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, c - 1);
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = dist(gen);
  return t;
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
  cu::log_softmax<T>(x.data(), y.data(), outer, c, inner, nullptr);
  std::vector<ref_t<T>> want(static_cast<size_t>(n));
  cpu::log_softmax<ref_t<T>>(convert_all<ref_t<T>>(x).data(), want.data(), outer, c, inner);
  expect_close(y, want, atol<T>(), default_rtol<T>(),
               shape_str("log_softmax", type_name<T>(), shape));

  // Backward from the forward's stored output, as the engine saves it.
  const auto g = random_values<T>(n, uint64_t(n + 12));
  std::vector<T> gi(static_cast<size_t>(n));
  cu::log_softmax_backward<T>(g.data(), y.data(), gi.data(), outer, c, inner, nullptr);
  std::vector<ref_t<T>> want_gi(static_cast<size_t>(n));
  cpu::log_softmax_backward<ref_t<T>>(convert_all<ref_t<T>>(g).data(),
                                      convert_all<ref_t<T>>(y).data(), want_gi.data(), outer, c,
                                      inner);
  expect_close(gi, want_gi, atol<T>(), default_rtol<T>(),
               shape_str("log_softmax_backward", type_name<T>(), shape));
}

// softmax is exp(log_softmax) of the CPU kernel; its backward (no CPU kernel) is
// y * (g - sum(g * y)) in double on the same stored inputs.
template <class T>
void check_softmax(const std::array<int64_t, 3>& shape) {
  const auto [outer, c, inner] = shape;
  const int64_t n = outer * c * inner;
  const auto x = random_values<T>(n, uint64_t(n + 21));
  std::vector<T> y(static_cast<size_t>(n));
  cu::softmax<T>(x.data(), y.data(), outer, c, inner, nullptr);
  std::vector<ref_t<T>> want(static_cast<size_t>(n));
  cpu::log_softmax<ref_t<T>>(convert_all<ref_t<T>>(x).data(), want.data(), outer, c, inner);
  for (auto& w : want) w = std::exp(w);
  expect_close(y, want, atol<T>() * 0.1, default_rtol<T>(),
               shape_str("softmax", type_name<T>(), shape));

  const auto g = random_values<T>(n, uint64_t(n + 22));
  std::vector<T> gi(static_cast<size_t>(n));
  cu::softmax_backward<T>(g.data(), y.data(), gi.data(), outer, c, inner, nullptr);
  const auto gd = convert_all<double>(g), yd = convert_all<double>(y);
  std::vector<double> want_gi(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t base = o * c * inner + i;
      double s = 0;
      for (int64_t k = 0; k < c; ++k)
        s += gd[size_t(base + k * inner)] * yd[size_t(base + k * inner)];
      for (int64_t k = 0; k < c; ++k) {
        const size_t at = size_t(base + k * inner);
        want_gi[at] = yd[at] * (gd[at] - s);
      }
    }
  }
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
  cu::nll_loss<T>(lp.data(), target.data(), loss.data(), n, c, nullptr);
  const auto lpr = convert_all<ref_t<T>>(lp);
  const double want = cpu::nll_loss<ref_t<T>>(lpr.data(), target.data(), n, c) / double(n);
  expect_close(loss, std::vector<double>{want}, atol<T>(), default_rtol<T>(), "nll_loss " + what);

  const std::vector<T> grad_loss = {kernels::cpu::convert<T>(0.75f)};
  std::vector<T> gi(size_t(n * c));
  cu::nll_loss_backward<T>(target.data(), grad_loss.data(), gi.data(), n, c, nullptr);
  std::vector<ref_t<T>> want_gi(gi.size());
  const double g = as_double(grad_loss[0]);
  cpu::nll_loss_backward<ref_t<T>>(target.data(), want_gi.data(), n, c, ref_t<T>(-g / double(n)));
  expect_close(gi, want_gi, 0.0, default_rtol<T>(), "nll_loss_backward " + what);
}

template <class T>
void check_cross_entropy(int64_t n, int64_t c, double eps) {
  const std::string what = ::rg::detail::cat(type_name<T>(), " n=", n, " c=", c, " eps=", eps);
  const auto x = random_values<T>(n * c, uint64_t(n * 37 + c), -4.f, 4.f);
  const auto target = random_targets(n, c, uint64_t(n + 2 * c));
  std::vector<T> lse(static_cast<size_t>(n)), loss(1);
  std::vector<unsigned char> workspace(size_t(cu::cross_entropy_workspace_bytes(n)));
  cu::cross_entropy<T>(x.data(), target.data(), lse.data(), loss.data(), n, c, eps,
                       workspace.data(), nullptr);
  const auto xr = convert_all<ref_t<T>>(x);
  std::vector<ref_t<T>> want_lse(static_cast<size_t>(n));
  const double want =
      cpu::cross_entropy<ref_t<T>>(xr.data(), target.data(), want_lse.data(), n, c, eps) /
      double(n);
  expect_close(lse, want_lse, atol<T>(), default_rtol<T>(), "cross_entropy lse " + what);
  expect_close(loss, std::vector<double>{want}, atol<T>(), default_rtol<T>(),
               "cross_entropy " + what);

  // Backward from the forward's stored lse, as the engine saves it.
  const std::vector<T> grad_loss = {kernels::cpu::convert<T>(1.25f)};
  std::vector<T> gi(size_t(n * c));
  cu::cross_entropy_backward<T>(x.data(), target.data(), lse.data(), grad_loss.data(), gi.data(), n,
                                c, eps, nullptr);
  std::vector<ref_t<T>> want_gi(gi.size());
  const double scale = as_double(grad_loss[0]) / double(n);
  cpu::cross_entropy_backward<ref_t<T>>(xr.data(), target.data(), convert_all<ref_t<T>>(lse).data(),
                                        want_gi.data(), n, c, eps, ref_t<T>(scale));
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

// An out-of-range target is never read through: the loss says NaN instead.
TEST(EmuSoftmaxLoss, OutOfRangeTargetGivesNanLoss) {
  const std::vector<float> x = {0.f, 1.f, 2.f, 3.f, 4.f, 5.f};
  const std::vector<int64_t> target = {1, 3};
  std::vector<float> loss(1), lse(2);
  cu::nll_loss<float>(x.data(), target.data(), loss.data(), 2, 3, nullptr);
  EXPECT_TRUE(std::isnan(loss[0]));
  std::vector<unsigned char> workspace(size_t(cu::cross_entropy_workspace_bytes(2)));
  cu::cross_entropy<float>(x.data(), target.data(), lse.data(), loss.data(), 2, 3, 0.0,
                           workspace.data(), nullptr);
  EXPECT_TRUE(std::isnan(loss[0]));
}

TEST(EmuSoftmaxLoss, LossesAreDeterministic) {
  const int64_t n = 4097, c = 33;
  const auto x = random_values<float>(n * c, 5, -10.f, 10.f);
  const auto target = random_targets(n, c, 6);
  std::vector<unsigned char> workspace(size_t(cu::cross_entropy_workspace_bytes(n)));
  std::vector<float> lse(static_cast<size_t>(n));
  float a = 0, b = 0, na = 0, nb = 0;
  cu::cross_entropy<float>(x.data(), target.data(), lse.data(), &a, n, c, 0.1, workspace.data(),
                           nullptr);
  cu::cross_entropy<float>(x.data(), target.data(), lse.data(), &b, n, c, 0.1, workspace.data(),
                           nullptr);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(float)), 0);
  cu::nll_loss<float>(x.data(), target.data(), &na, n, c, nullptr);
  cu::nll_loss<float>(x.data(), target.data(), &nb, n, c, nullptr);
  EXPECT_EQ(std::memcmp(&na, &nb, sizeof(float)), 0);
}

TEST(EmuSoftmaxLoss, RejectsBadArguments) {
  std::vector<float> x(8), out(8), lse(2);
  const std::vector<int64_t> target = {0, 1};
  std::vector<unsigned char> workspace(size_t(cu::cross_entropy_workspace_bytes(2)));
  EXPECT_THROW(cu::log_softmax<float>(x.data(), out.data(), 2, -1, 1, nullptr), Error);
  EXPECT_THROW(cu::nll_loss<float>(x.data(), target.data(), out.data(), 2, 0, nullptr), Error);
  EXPECT_THROW(cu::cross_entropy<float>(x.data(), target.data(), lse.data(), out.data(), 2, 4, 1.5,
                                        workspace.data(), nullptr),
               Error);
  EXPECT_THROW(cu::cross_entropy<float>(x.data(), target.data(), lse.data(), out.data(), 2, 4, 0.0,
                                        nullptr, nullptr),
               Error);
}

}  // namespace
}  // namespace rg::emu_kernel_test
