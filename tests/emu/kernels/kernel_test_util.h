// Shared helpers of the emulated-kernel tests: the awkward sizes every kernel is tried on,
// reproducible random inputs in any storage type, and the |a-b| <= atol + rtol*|b| comparison
// that reports the first mismatch only.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cast.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/half.h"

namespace rg::emu_kernel_test {

// These tests hand the kernels plain host memory and read it right after each launch, so every
// launch waits for its work, as with CUDA_LAUNCH_BLOCKING=1 (stream ordering is tested through
// the engine, tests/device and tests/emu/stream_runtime_test.cpp).
inline const bool kLaunchBlocking = (emu::set_launch_blocking(true), true);

// Element counts: below, at and past warp and block boundaries.
inline const std::vector<int64_t> kAwkwardSizes = {1, 31, 33, 1000, 4097};

// n class indices drawn uniformly from [0, c); the same for the same seed.
inline std::vector<int64_t> random_targets(int64_t n, int64_t c, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, c - 1);
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = dist(gen);
  return t;
}

// n values uniform in [lo, hi), converted (rounded) to T; the same for the same seed.
template <class T>
std::vector<T> random_values(int64_t n, uint64_t seed, float lo = -2.f, float hi = 2.f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = kernels::cpu::convert<T>(dist(gen));
  return v;
}

template <class T>
double as_double(T x) {
  return kernels::cpu::convert<double>(x);
}

// got[i] within atol + rtol * |want[i]| of want[i] for every i (NaNs must match NaNs).
template <class T, class U>
void expect_close(const std::vector<T>& got, const std::vector<U>& want, double atol,
                  double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = as_double(got[i]), w = as_double(want[i]);
    if ((std::isnan(w) && std::isnan(g)) || g == w) continue;  // g == w: equal infinities too
    if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
      ADD_FAILURE() << what << ": element " << i << " of " << got.size() << " is " << g
                    << ", expected " << w;
      return;
    }
  }
}

// Tolerances per storage type for a kernel that computes in f32 like the CPU kernel.
template <class T>
constexpr double default_rtol() {
  if constexpr (std::is_same_v<T, Half>) return 2e-3;
  if constexpr (std::is_same_v<T, BFloat16>) return 1.6e-2;
  return 1e-5;
}

}  // namespace rg::emu_kernel_test
