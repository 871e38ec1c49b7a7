// kernels/cuda/grad_scaler.cu under the CUDA emulator: unscale by 1/scale with the found-inf flag,
// against the obvious loop (there is no CPU kernel), in every type, with inf and NaN at the first
// element, inside a block, and in the last partial block.
#include "kernels/cuda/grad_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/cpu/cast.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

// The reference: x * inv in the compute type, rounded once; untouched when inv == 1.
template <class T>
std::vector<T> unscaled(const std::vector<T>& x, float inv) {
  if (inv == 1.f) return x;
  std::vector<T> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = cpu::convert<T>(cpu::convert<ref_t<T>>(x[i]) * static_cast<ref_t<T>>(inv));
  }
  return out;
}

template <class T>
bool any_non_finite(const std::vector<T>& x) {
  for (const T& v : x) {
    if (!std::isfinite(as_double(v))) return true;
  }
  return false;
}

// Places of one bad value in an array of n elements: first, middle, last.
std::vector<int64_t> bad_places(int64_t n) { return {0, n / 2, n - 1}; }

TEST(EmuGradScaler, UnscaleMatchesReference) {
  for_each_float_type([]<class T>() {
    for (const float inv : {1.f / 65536.f, 1.f / 3.f, 1.f}) {
      for (const int64_t n : kAwkwardSizes) {
        const std::string what = label<T>("unscale inv=" + std::to_string(inv), n);
        // All finite: found_inf stays 0.
        auto x = random_values<T>(n, 60 + n, -1000.f, 1000.f);
        const auto want = unscaled(x, inv);
        float found_inf = 0.f;
        cuda::unscale_check_finite(x.data(), n, &found_inf, &inv, nullptr);
        expect_bits_equal(x, want, what);
        EXPECT_EQ(found_inf, 0.f) << what;
      }
    }
  });
}

TEST(EmuGradScaler, InfAndNanSetFoundInf) {
  const float kInf = std::numeric_limits<float>::infinity();
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  for_each_float_type([&]<class T>() {
    const float inv = 0.125f;
    for (const int64_t n : kAwkwardSizes) {
      for (const float bad : {kInf, -kInf, kNan}) {
        for (const int64_t place : bad_places(n)) {
          const std::string what =
              label<T>("bad " + std::to_string(bad) + " at " + std::to_string(place), n);
          auto x = random_values<T>(n, 70 + n);
          x[size_t(place)] = cpu::convert<T>(bad);
          ASSERT_TRUE(any_non_finite(x));
          const auto want = unscaled(x, inv);
          float found_inf = 0.f;
          cuda::unscale_check_finite(x.data(), n, &found_inf, &inv, nullptr);
          EXPECT_EQ(found_inf, 1.f) << what;
          // Every element is still scaled; inf stays inf, NaN stays NaN.
          expect_bits_equal(x, want, what);
          EXPECT_EQ(std::isnan(as_double(x[size_t(place)])), std::isnan(bad)) << what;
          EXPECT_EQ(as_double(x[size_t(place)]) == double(bad), !std::isnan(bad)) << what;
        }
      }
    }
  });
}

TEST(EmuGradScaler, FoundInfIsNeverCleared) {
  // One flag across several gradients: a finite gradient after a bad one keeps it set.
  const float inv = 0.5f;
  float found_inf = 0.f;
  std::vector<float> bad = {1.f, std::numeric_limits<float>::infinity()};
  std::vector<float> good = random_values<float>(1000, 3);
  cuda::unscale_check_finite(bad.data(), 2, &found_inf, &inv, nullptr);
  EXPECT_EQ(found_inf, 1.f);
  cuda::unscale_check_finite(good.data(), 1000, &found_inf, &inv, nullptr);
  EXPECT_EQ(found_inf, 1.f);
}

TEST(EmuGradScaler, ZeroSizeDoesNothingAndBadArgumentsThrow) {
  const float inv = 0.5f;
  float found_inf = 0.f;
  std::vector<float> x = {std::numeric_limits<float>::infinity()};
  cuda::unscale_check_finite(x.data(), 0, &found_inf, &inv, nullptr);
  EXPECT_EQ(found_inf, 0.f);
  EXPECT_EQ(x[0], std::numeric_limits<float>::infinity());
  EXPECT_THROW(cuda::unscale_check_finite(x.data(), -1, &found_inf, &inv, nullptr), rg::Error);
  EXPECT_THROW(cuda::unscale_check_finite(x.data(), 1, nullptr, &inv, nullptr), rg::Error);
}

// 1/scale on the device: the f64 reciprocal rounded to f32 once, as GradScaler on the host.
TEST(EmuGradScaler, InverseScaleIsTheF64ReciprocalRoundedOnce) {
  for (const float scale : {65536.f, 3.f, 1.f, 1e-30f, 7.5e37f, 0.1f}) {
    float inv = -1.f;
    cuda::inverse_scale(&scale, &inv, nullptr);
    EXPECT_EQ(inv, static_cast<float>(1.0 / double(scale))) << scale;
  }
}

// The scale's update on the device against GradScaler::update's host rules, step by step: backoff
// on an overflow (tracker reset), growth after growth_interval good steps in a row, and no growth
// past f32 (the tracker still resets).
TEST(EmuGradScaler, UpdateScaleFollowsTheHostRules) {
  struct Host {
    float scale;
    int64_t tracker = 0;
    void update(bool found, double growth, double backoff, int64_t interval) {
      if (found) {
        scale = static_cast<float>(double(scale) * backoff);
        tracker = 0;
      } else if (++tracker == interval) {
        const auto grown = static_cast<float>(double(scale) * growth);
        if (std::isfinite(grown)) scale = grown;
        tracker = 0;
      }
    }
  };
  const std::vector<bool> founds = {false, false, false, true,  false, false, false, false, true,
                                    true,  false, false, false, false, false, false, false};
  for (const float start : {65536.f, 3.f, std::numeric_limits<float>::max() / 3.f}) {
    Host host{start};
    float scale = start;
    int64_t tracker = 0;
    for (size_t i = 0; i < founds.size(); ++i) {
      const float found = founds[i] ? 1.f : 0.f;
      cuda::update_scale(&scale, &tracker, &found, 2.0, 0.5, 3, nullptr);
      host.update(founds[i], 2.0, 0.5, 3);
      ASSERT_EQ(scale, host.scale) << "start " << start << ", step " << i;
      ASSERT_EQ(tracker, host.tracker) << "start " << start << ", step " << i;
    }
  }
}

}  // namespace
}  // namespace rg::emu_kernel_test
