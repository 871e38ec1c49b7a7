// kernels/cuda/optim.cu under the CUDA emulator against kernels/cpu/optim: fused SGD (momentum,
// dampening, Nesterov, weight decay) and Adam/AdamW over several steps, in f32, f64, f16 and bf16.
// For f16/bf16 the CPU reference steps in f32 and its parameters and state are rounded after each
// step, which is what the CUDA kernel stores.
#include "kernels/optim.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

using CpuOptim = kernels::Optim<kernels::Cpu>;
using CudaOptim = kernels::Optim<kernels::Cuda>;
using kernels::AdamParams;
using kernels::SgdParams;

constexpr int kSteps = 3;
constexpr double kAtol = 1e-6;

struct SgdCase {
  const char* name;
  SgdParams params;
};
const std::vector<SgdCase> kSgdCases = {
    {"plain", {0.1, 0.0, 0.0, 0.0, false}},
    {"weight decay", {0.1, 0.0, 0.0, 1e-2, false}},
    {"momentum", {0.05, 0.9, 0.0, 0.0, false}},
    {"momentum dampening wd", {0.05, 0.9, 0.1, 5e-4, false}},
    {"nesterov wd", {0.05, 0.9, 0.0, 1e-3, true}},
};

TEST(EmuOptim, SgdMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto& c : kSgdCases) {
      for (const int64_t n : kAwkwardSizes) {
        auto p = random_values<T>(n, 10 + n), buf = std::vector<T>(static_cast<size_t>(n));
        auto ref_p = p, ref_buf = buf;
        for (int step = 0; step < kSteps; ++step) {
          const auto g = random_values<T>(n, 1000 * step + n);
          const bool first = step == 0;
          CudaOptim::sgd_step(p.data(), g.data(), buf.data(), n, c.params, first, {});
          auto wp = widen(ref_p), wbuf = widen(ref_buf);
          CpuOptim::sgd_step(wp.data(), widen(g).data(), wbuf.data(), n, c.params, first, {});
          ref_p = narrow<T>(wp);
          ref_buf = narrow<T>(wbuf);
        }
        const std::string what = label<T>(std::string("sgd ") + c.name, n);
        expect_close(p, ref_p, kAtol, default_rtol<T>(), what + " params");
        expect_close(buf, ref_buf, kAtol, default_rtol<T>(), what + " momentum");
      }
    }
  });
}

TEST(EmuOptim, SgdWithoutMomentumNeedsNoBuffer) {
  const int64_t n = 33;
  auto p = random_values<float>(n, 1);
  const auto g = random_values<float>(n, 2);
  auto want = p;
  const SgdParams params{0.1, 0.0, 0.0, 1e-2, false};
  CudaOptim::sgd_step<float>(p.data(), g.data(), nullptr, n, params, true, {});
  CpuOptim::sgd_step<float>(want.data(), g.data(), nullptr, n, params, true, {});
  expect_close(p, want, 0, 0, "sgd without buffer");
  const SgdParams with_momentum{0.1, 0.9, 0.0, 0.0, false};
  EXPECT_THROW(CudaOptim::sgd_step<float>(p.data(), g.data(), nullptr, n, with_momentum, true, {}),
               rg::Error);
}

struct AdamCase {
  const char* name;
  AdamParams params;
};
const std::vector<AdamCase> kAdamCases = {
    {"adam", {1e-2, 0.9, 0.999, 1e-8, 0.0, false}},
    {"adam l2", {1e-2, 0.9, 0.999, 1e-8, 1e-2, false}},
    {"adamw", {1e-2, 0.9, 0.999, 1e-8, 1e-2, true}},
    {"adamw betas", {3e-3, 0.8, 0.99, 1e-6, 0.1, true}},
};

TEST(EmuOptim, AdamMatchesCpu) {
  for_each_float_type([]<class T>() {
    for (const auto& c : kAdamCases) {
      for (const int64_t n : kAwkwardSizes) {
        auto p = random_values<T>(n, 20 + n);
        std::vector<T> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
        auto ref_p = p, ref_m = m, ref_v = v;
        for (int step = 1; step <= kSteps; ++step) {
          const auto g = random_values<T>(n, 2000 * step + n);
          CudaOptim::adam_step(p.data(), g.data(), m.data(), v.data(), n, c.params, step, {});
          auto wp = widen(ref_p), wm = widen(ref_m), wv = widen(ref_v);
          CpuOptim::adam_step(wp.data(), widen(g).data(), wm.data(), wv.data(), n, c.params, step,
                              {});
          ref_p = narrow<T>(wp);
          ref_m = narrow<T>(wm);
          ref_v = narrow<T>(wv);
        }
        const std::string what = label<T>(c.name, n);
        expect_close(p, ref_p, kAtol, default_rtol<T>(), what + " params");
        expect_close(m, ref_m, kAtol, default_rtol<T>(), what + " first moment");
        expect_close(v, ref_v, kAtol, default_rtol<T>(), what + " second moment");
      }
    }
  });
}

// The multi-tensor steps (sgd_step_many, adam_step_many: one launch per 24 parameters) against
// one call per parameter, bit for bit: 30 parameters (two launches), empty ones among them, each
// with its own weight decay, first-step flag or step number, in every dtype and both backends.
template <class T>
struct ManyParams {
  std::vector<std::vector<T>> p, g, s1, s2;
  std::vector<kernels::ParamUpdate<T>> updates() {
    std::vector<kernels::ParamUpdate<T>> u;
    for (size_t t = 0; t < p.size(); ++t)
      u.push_back({p[t].data(), g[t].data(), s1[t].data(), s2[t].data(), int64_t(p[t].size()),
                   t % 3 == 0 ? 0.0 : 1e-3 * double(t), t % 2 == 0, int64_t(1 + t % 4)});
    return u;
  }
};

template <class T>
ManyParams<T> many_params() {
  ManyParams<T> m;
  for (uint64_t t = 0; t < 30; ++t) {
    const int64_t n = t % 7 == 6 ? 0 : kAwkwardSizes[t % kAwkwardSizes.size()];
    m.p.push_back(random_values<T>(n, 100 + t));
    m.g.push_back(random_values<T>(n, 200 + t));
    m.s1.push_back(random_values<T>(n, 300 + t));
    m.s2.push_back(random_values<T>(n, 400 + t, 0.f, 1.f));  // a second moment is >= 0
  }
  return m;
}

template <class B, class T>
void expect_many_equals_one_at_a_time(const std::string& backend) {
  for (const auto& c : kSgdCases) {
    ManyParams<T> many = many_params<T>(), one = many;
    auto u = many.updates();
    kernels::Optim<B>::sgd_step_many(u.data(), int64_t(u.size()), c.params, {});
    for (const auto& x : one.updates()) {
      SgdParams sp = c.params;
      sp.weight_decay = x.weight_decay;
      kernels::Optim<B>::sgd_step(x.p, x.g, x.state1, x.n, sp, x.first_step, {});
    }
    for (size_t t = 0; t < many.p.size(); ++t) {
      const std::string what = backend + label<T>(std::string(" sgd_step_many ") + c.name, t);
      expect_close(many.p[t], one.p[t], 0, 0, what + " params");
      expect_close(many.s1[t], one.s1[t], 0, 0, what + " momentum");
    }
  }
  for (const auto& c : kAdamCases) {
    ManyParams<T> many = many_params<T>(), one = many;
    auto u = many.updates();
    kernels::Optim<B>::adam_step_many(u.data(), int64_t(u.size()), c.params, {});
    for (const auto& x : one.updates()) {
      AdamParams ap = c.params;
      ap.weight_decay = x.weight_decay;
      kernels::Optim<B>::adam_step(x.p, x.g, x.state1, x.state2, x.n, ap, x.step, {});
    }
    for (size_t t = 0; t < many.p.size(); ++t) {
      const std::string what = backend + label<T>(std::string(" adam_step_many ") + c.name, t);
      expect_close(many.p[t], one.p[t], 0, 0, what + " params");
      expect_close(many.s1[t], one.s1[t], 0, 0, what + " first moment");
      expect_close(many.s2[t], one.s2[t], 0, 0, what + " second moment");
    }
  }
}

TEST(EmuOptim, ManyTensorsInOneLaunchEqualOneAtATimeBitwise) {
  for_each_float_type([]<class T>() { expect_many_equals_one_at_a_time<kernels::Cuda, T>("cuda"); });
  expect_many_equals_one_at_a_time<kernels::Cpu, float>("cpu");
  expect_many_equals_one_at_a_time<kernels::Cpu, double>("cpu");
}

TEST(EmuOptim, ZeroSizeDoesNothingAndBadArgumentsThrow) {
  std::vector<float> p = {42.f}, g = {1.f}, m = {0.f}, v = {0.f};
  CudaOptim::sgd_step(p.data(), g.data(), m.data(), 0, {0.1, 0.9, 0, 0, false}, true, {});
  CudaOptim::adam_step(p.data(), g.data(), m.data(), v.data(), 0, {0.1, 0.9, 0.99, 1e-8, 0, false},
                       1, {});
  EXPECT_EQ(p[0], 42.f);
  // The same checks on both backends (the CPU's used to trust its caller).
  const auto both = [&]<class K>() {
    EXPECT_THROW(K::template adam_step<float>(p.data(), g.data(), m.data(), v.data(), 1,
                                              {0.1, 0.9, 0.99, 1e-8, 0, false}, 0, {}),
                 rg::Error);
    EXPECT_THROW(K::template sgd_step<float>(p.data(), g.data(), m.data(), -1,
                                             {0.1, 0, 0, 0, false}, true, {}),
                 rg::Error);
    EXPECT_THROW(K::template sgd_step<float>(p.data(), g.data(), nullptr, 1,
                                             {0.1, 0.9, 0, 0, false}, true, {}),
                 rg::Error);
  };
  both.template operator()<CudaOptim>();
  both.template operator()<CpuOptim>();
}

}  // namespace
}  // namespace rg::emu_kernel_test
