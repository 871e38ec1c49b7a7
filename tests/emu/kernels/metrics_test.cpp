// kernels/metrics.h: Metrics<Cuda> (kernels/cuda/metrics.cu under the CUDA emulator): argmax along
// the last and inner dimensions and top-k hit counts (with the first row of a bad target), every
// storage type, awkward sizes, ties and NaN, against reference loops in double (the half types
// have no CPU kernel) and, in f32/f64, against Metrics<Cpu> on the same arguments; the shared
// argument checks on both backends.
#include "kernels/metrics.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

using Cu = kernels::Metrics<kernels::Cuda>;
using Cpu = kernels::Metrics<kernels::Cpu>;

// engine/ops/metrics.cpp's ranking: NaN is the largest value.
bool ranks_above(double a, double b) { return a > b || (std::isnan(a) && !std::isnan(b)); }
bool ranks_same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// engine/ops/metrics.cpp's argmax loop: the reduced dimension outermost, first winner kept.
template <class T>
std::vector<int64_t> reference_argmax(const std::vector<T>& x, int64_t outer, int64_t c,
                                      int64_t inner) {
  std::vector<int64_t> idx(size_t(outer * inner), 0);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      double best = as_double(x[size_t(o * c * inner + i)]);
      for (int64_t k = 1; k < c; ++k) {
        const double v = as_double(x[size_t((o * c + k) * inner + i)]);
        if (ranks_above(v, best)) {
          best = v;
          idx[size_t(o * inner + i)] = k;
        }
      }
    }
  }
  return idx;
}

// engine/ops/metrics.cpp's topk_correct loop: the target's rank counts the classes above it and
// the equal ones before it.
template <class T>
int64_t reference_topk_correct(const std::vector<T>& logits, const std::vector<int64_t>& target,
                               int64_t n, int64_t c, int64_t k) {
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = target[size_t(i)];
    const double v = as_double(logits[size_t(i * c + t)]);
    int64_t rank = 0;
    for (int64_t j = 0; j < c; ++j) {
      const double u = as_double(logits[size_t(i * c + j)]);
      rank += ranks_above(u, v) || (j < t && ranks_same(u, v));
    }
    correct += rank < k;
  }
  return correct;
}

// Random values on a coarse grid (many ties) with a few NaNs and infinities.
template <class T>
std::vector<T> tricky_values(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> level(-8, 8);
  std::uniform_int_distribution<int> special(0, 199);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) {
    const int s = special(gen);
    float f = float(level(gen)) * 0.25f;
    if (s == 0) f = std::numeric_limits<float>::quiet_NaN();
    if (s == 1) f = std::numeric_limits<float>::infinity();
    if (s == 2) f = -std::numeric_limits<float>::infinity();
    x = kernels::cpu::convert<T>(f);
  }
  return v;
}

std::vector<std::array<int64_t, 3>> argmax_shapes() {
  std::vector<std::array<int64_t, 3>> s;
  for (int64_t c : kAwkwardSizes) {
    s.push_back({1, c, 1});
    s.push_back({33, c, 1});
    s.push_back({2, c, 5});
  }
  for (int64_t outer : kAwkwardSizes) s.push_back({outer, 10, 1});
  s.push_back({3, 31, 33});
  return s;
}

template <class T>
void check_argmax(const std::array<int64_t, 3>& shape, bool tricky) {
  const auto [outer, c, inner] = shape;
  const int64_t n = outer * c * inner;
  const auto x = tricky ? tricky_values<T>(n, uint64_t(n + 1)) : random_values<T>(n, uint64_t(n));
  std::vector<int64_t> got(size_t(outer * inner), -1);
  Cu::argmax<T>(x.data(), got.data(), outer, c, inner, {});
  EXPECT_EQ(got, reference_argmax(x, outer, c, inner))
      << "argmax " << type_name<T>() << (tricky ? " ties/NaN" : "") << " (" << outer << ", " << c
      << ", " << inner << ")";
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    std::vector<int64_t> cpu(got.size(), -1);
    Cpu::argmax<T>(x.data(), cpu.data(), outer, c, inner, {});
    EXPECT_EQ(got, cpu) << "vs the CPU kernel (" << outer << ", " << c << ", " << inner << ")";
  }
}

TEST(EmuMetrics, ArgmaxAlongLastDimMatchesEngine) {
  for_each_float_type([]<class T>() {
    for (const auto& s : argmax_shapes()) {
      if (s[2] == 1) check_argmax<T>(s, false);
    }
  });
}

TEST(EmuMetrics, ArgmaxAlongInnerDimMatchesEngine) {
  for_each_float_type([]<class T>() {
    for (const auto& s : argmax_shapes()) {
      if (s[2] != 1) check_argmax<T>(s, false);
    }
  });
}

// Ties go to the lowest index, NaN beats everything (the first NaN wins), -inf rows still have
// an argmax.
TEST(EmuMetrics, ArgmaxTiesAndNanMatchEngine) {
  for_each_float_type([]<class T>() {
    for (const auto& s : argmax_shapes()) check_argmax<T>(s, true);
  });
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {-inf, -inf, -inf, 1.f, 1.f, 0.f};
  std::vector<int64_t> got(2);
  Cu::argmax<float>(x.data(), got.data(), 2, 3, 1, {});
  EXPECT_EQ(got, (std::vector<int64_t>{0, 0}));
}

TEST(EmuMetrics, TopkCorrectMatchesEngine) {
  for_each_float_type([]<class T>() {
    std::vector<std::array<int64_t, 2>> shapes;
    for (int64_t c : kAwkwardSizes) shapes.push_back({33, c});
    for (int64_t n : kAwkwardSizes) shapes.push_back({n, 10});
    for (const auto& [n, c] : shapes) {
      for (bool tricky : {false, true}) {
        const auto logits = tricky ? tricky_values<T>(n * c, uint64_t(n * c + 3))
                                   : random_values<T>(n * c, uint64_t(n * c + 2));
        const auto target = random_targets(n, c, uint64_t(n + c));
        for (int64_t k : {int64_t(1), int64_t(5), c}) {
          if (k > c) continue;
          int64_t got[2] = {-1, -1};
          Cu::topk_correct<T>(logits.data(), target.data(), n, c, k, got, {});
          EXPECT_EQ(got[0], reference_topk_correct(logits, target, n, c, k))
              << "topk_correct " << type_name<T>() << (tricky ? " ties/NaN" : "") << " n=" << n
              << " c=" << c << " k=" << k;
          EXPECT_EQ(got[1], n) << "no target is out of range";
          if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
            int64_t cpu[2] = {-1, -1};
            Cpu::topk_correct<T>(logits.data(), target.data(), n, c, k, cpu, {});
            EXPECT_EQ(got[0], cpu[0]) << "vs the CPU kernel, n=" << n << " c=" << c << " k=" << k;
            EXPECT_EQ(got[1], cpu[1]);
          }
        }
      }
    }
  });
}

TEST(EmuMetrics, TopkCorrectCountsEveryRowOnceAndNamesTheFirstBadTarget) {
  // Row i's maximum is at class i % c, so every row is a top-1 hit for target i % c.
  const int64_t n = 4097, c = 7;
  std::vector<float> logits(size_t(n * c), 0.f);
  std::vector<int64_t> target(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    logits[size_t(i * c + i % c)] = 1.f;
    target[size_t(i)] = i % c;
  }
  int64_t got[2] = {-1, -1}, cpu[2] = {-1, -1};
  Cu::topk_correct<float>(logits.data(), target.data(), n, c, 1, got, {});
  EXPECT_EQ(got[0], n);
  EXPECT_EQ(got[1], n);
  // Bad targets in rows 4000 (in a late block) and 3000: the first one is named, the others
  // still count.
  target[4000] = -1;
  target[3000] = c;
  Cu::topk_correct<float>(logits.data(), target.data(), n, c, c, got, {});
  Cpu::topk_correct<float>(logits.data(), target.data(), n, c, c, cpu, {});
  EXPECT_EQ(got[0], n - 2);
  EXPECT_EQ(got[1], 3000);
  EXPECT_EQ(got[0], cpu[0]);
  EXPECT_EQ(got[1], cpu[1]);
  Cu::topk_correct<float>(logits.data(), target.data(), 0, c, 1, got, {});
  EXPECT_EQ(got[0], 0);
  EXPECT_EQ(got[1], 0);
}

// The CPU kernels run in parallel with the Ctx's thread budget: integer results, the same for any
// number of threads.
TEST(EmuMetrics, CpuResultsDoNotDependOnTheThreadCount) {
  const int64_t n = 4097, c = 33;
  const auto logits = tricky_values<float>(n * c, 7);
  auto target = random_targets(n, c, 8);
  target[2500] = -3;
  target[1200] = c;
  std::vector<int64_t> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  int64_t want_counts[2] = {-1, -1}, got_counts[2] = {-1, -1};
  Cpu::argmax<float>(logits.data(), want.data(), n, c, 1, kernels::Ctx{nullptr, 1});
  Cpu::topk_correct<float>(logits.data(), target.data(), n, c, 5, want_counts,
                           kernels::Ctx{nullptr, 1});
  EXPECT_EQ(want_counts[1], 1200);
  for (int threads : {2, 3, 0}) {
    Cpu::argmax<float>(logits.data(), got.data(), n, c, 1, kernels::Ctx{nullptr, threads});
    EXPECT_EQ(got, want) << threads << " threads";
    Cpu::argmax<float>(logits.data(), got.data(), 3, c, 1365, kernels::Ctx{nullptr, threads});
    std::vector<int64_t> columns(got.begin(), got.begin() + 3 * 1365);
    Cpu::argmax<float>(logits.data(), got.data(), 3, c, 1365, kernels::Ctx{nullptr, 1});
    EXPECT_EQ(columns, std::vector<int64_t>(got.begin(), got.begin() + 3 * 1365));
    Cpu::topk_correct<float>(logits.data(), target.data(), n, c, 5, got_counts,
                             kernels::Ctx{nullptr, threads});
    EXPECT_EQ(got_counts[0], want_counts[0]) << threads << " threads";
    EXPECT_EQ(got_counts[1], want_counts[1]) << threads << " threads";
  }
}

// The same argument checks on both backends.
template <class K>
void check_rejects_bad_arguments(const char* backend) {
  SCOPED_TRACE(backend);
  std::vector<float> x(8);
  std::vector<int64_t> out(8), target(2, 0);
  EXPECT_THROW(K::template argmax<float>(x.data(), out.data(), 2, 0, 1, {}), Error);
  EXPECT_THROW(K::template argmax<float>(x.data(), out.data(), -1, 4, 1, {}), Error);
  EXPECT_THROW(K::template topk_correct<float>(x.data(), target.data(), 2, 4, 0, out.data(), {}),
               Error);
  EXPECT_THROW(K::template topk_correct<float>(x.data(), target.data(), 2, 4, 5, out.data(), {}),
               Error);
  EXPECT_THROW(K::template topk_correct<float>(x.data(), target.data(), 2, 0, 1, out.data(), {}),
               Error);
  // Nothing to do for no rows: nothing read, counts (0, 0).
  EXPECT_NO_THROW(K::template argmax<float>(nullptr, nullptr, 0, 4, 1, {}));
  int64_t counts[2] = {-1, -1};
  K::template topk_correct<float>(nullptr, nullptr, 0, 4, 1, counts, {});
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[1], 0);
}

TEST(EmuMetrics, RejectsBadArgumentsOnBothBackends) {
  check_rejects_bad_arguments<Cu>("CUDA");
  check_rejects_bad_arguments<Cpu>("CPU");
}

}  // namespace
}  // namespace rg::emu_kernel_test
