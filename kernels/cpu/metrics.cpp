// argmax and top-k hit counting in single passes with no sort: a target is in the top k when fewer
// than k classes rank above it, so topk_correct costs O(C) per row.
#include "kernels/cpu/metrics.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/error.h"

namespace rg::kernels::cpu {
namespace {

// a ranks above b: larger, or NaN against a number (NaN is the largest value, as in PyTorch).
template <class T>
bool ranks_above(T a, T b) {
  return a > b || (std::isnan(a) && !std::isnan(b));
}

template <class T>
bool ranks_same(T a, T b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

}  // namespace

template <class T>
void argmax(const T* x, int64_t* out, int64_t outer, int64_t c, int64_t inner) {
  RG_CHECK(outer >= 0 && inner >= 0, "argmax: sizes must be non-negative, got outer ", outer,
           ", inner ", inner);
  RG_CHECK(c > 0, "argmax: cannot take the argmax of an empty dimension (c = ", c, ")");
  // Walk the reduced dimension in the outer loop so the inner loop reads contiguous memory.
  std::vector<T> best(static_cast<size_t>(inner));
  for (int64_t o = 0; o < outer; ++o) {
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
}

template <class T>
void topk_correct(const T* logits, const int64_t* target, int64_t n, int64_t c, int64_t k,
                  int64_t* counts) {
  RG_CHECK(n >= 0 && c > 0, "topk_correct: needs n >= 0 rows of c > 0 classes, got n ", n, ", c ",
           c);
  RG_CHECK(k >= 1 && k <= c, "topk_correct: k = ", k, " must be in [1, ", c, "] for ", c,
           " classes");
  int64_t correct = 0, first_bad = n;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = target[i];
    if (t < 0 || t >= c) {
      first_bad = std::min(first_bad, i);
      continue;
    }
    const T* row = logits + i * c;
    const T v = row[t];
    // Rank of the target: classes above it, plus equal classes that come before it.
    int64_t rank = 0;
    for (int64_t j = 0; j < c; ++j) rank += ranks_above(row[j], v) || (j < t && ranks_same(row[j], v));
    correct += rank < k;
  }
  counts[0] = correct;
  counts[1] = first_bad;
}

template void argmax<float>(const float*, int64_t*, int64_t, int64_t, int64_t);
template void argmax<double>(const double*, int64_t*, int64_t, int64_t, int64_t);
template void topk_correct<float>(const float*, const int64_t*, int64_t, int64_t, int64_t,
                                  int64_t*);
template void topk_correct<double>(const double*, const int64_t*, int64_t, int64_t, int64_t,
                                   int64_t*);

}  // namespace rg::kernels::cpu
