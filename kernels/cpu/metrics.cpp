// The metrics kernels on the CPU (kernels/metrics.h): argmax and top-k hit counting in single
// passes with no sort, parallel over outer slices and rows; a target is in the top k when fewer
// than k classes rank above it, so topk_correct costs O(C) per row.
#include "kernels/metrics.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {

constexpr int64_t kGrain = 1 << 14;  // values per parallel task

// a ranks above b: larger, or NaN against a number (NaN is the largest value, as in PyTorch).
template <class T>
bool ranks_above(T a, T b) {
  return a > b || (std::isnan(a) && !std::isnan(b));
}

template <class T>
bool ranks_same(T a, T b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

int64_t grain_for(int64_t per_item) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(per_item, 1));
}

}  // namespace

template <>
template <class T>
void Metrics<Cpu>::argmax(const T* x, int64_t* out, int64_t outer, int64_t c, int64_t inner,
                          Ctx ctx) {
  detail::check_argmax_sizes(outer, c, inner);
  if (outer == 0 || inner == 0) return;
  cpu::parallel_for(
      0, outer, grain_for(c * inner),
      [&](int64_t lo, int64_t hi) {
        // Walk the reduced dimension in the outer loop so the inner loop reads contiguous memory.
        std::vector<T> best(static_cast<size_t>(inner));
        for (int64_t o = lo; o < hi; ++o) {
          const T* base = x + o * c * inner;
          int64_t* oi = out + o * inner;
          std::copy_n(base, inner, best.begin());
          std::fill_n(oi, inner, int64_t(0));
          for (int64_t k = 1; k < c; ++k) {
            for (int64_t i = 0; i < inner; ++i) {
              const T v = base[k * inner + i];
              if (ranks_above(v, best[size_t(i)])) {
                best[size_t(i)] = v;
                oi[i] = k;
              }
            }
          }
        }
      },
      ctx.threads);
}

template <>
template <class T>
void Metrics<Cpu>::topk_correct(const T* logits, const int64_t* target, int64_t n, int64_t c,
                                int64_t k, int64_t* counts, Ctx ctx) {
  detail::check_topk_sizes(n, c, k);
  // One hit per row (0 or 1) and whether its target is bad, then integer totals in row order.
  std::vector<int8_t> hit(static_cast<size_t>(n));
  cpu::parallel_for(
      0, n, grain_for(c),
      [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const int64_t t = target[i];
          if (t < 0 || t >= c) {
            hit[size_t(i)] = -1;
            continue;
          }
          const T* row = logits + i * c;
          const T v = row[t];
          // Rank of the target: classes above it, plus equal classes that come before it.
          int64_t rank = 0;
          for (int64_t j = 0; j < c; ++j) {
            rank += ranks_above(row[j], v) || (j < t && ranks_same(row[j], v));
          }
          hit[size_t(i)] = rank < k ? 1 : 0;
        }
      },
      ctx.threads);
  int64_t correct = 0, first_bad = n;
  for (int64_t i = n - 1; i >= 0; --i) {
    if (hit[size_t(i)] < 0) {
      first_bad = i;
    } else {
      correct += hit[size_t(i)];
    }
  }
  counts[0] = correct;
  counts[1] = first_bad;
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_metrics_kernels() {
  using K = Metrics<Cpu>;
  return std::tuple{&K::argmax<T>, &K::topk_correct<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_metrics_kernels)

}  // namespace rg::kernels
