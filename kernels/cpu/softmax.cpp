// Softmax-family kernels with Eigen maps. Rows (inner == 1) are the fast path; other dimensions
// run over contiguous inner slices so the loops stay vectorizable. Per-row losses are summed in
// a fixed order, so results do not depend on the thread count.
#include "kernels/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/eigen_maps.h"
#include "kernels/cpu/parallel.h"

namespace rg::kernels::cpu {
namespace {
template <class T>
using Vec = Eigen::Array<T, Eigen::Dynamic, 1>;
constexpr int64_t kGrain = 1 << 14;  // elements per parallel chunk
constexpr int64_t kInnerChunk = 1024;

int64_t row_grain(int64_t c) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(c, 1)); }

// Runs fn(o, i0, len) over every (outer index, slice [i0, i0 + len) of inner) in parallel.
template <class F>
void for_each_slice(int64_t outer, int64_t c, int64_t inner, F&& fn) {
  const int64_t chunks = (inner + kInnerChunk - 1) / kInnerChunk;
  const int64_t grain =
      std::max<int64_t>(1, kGrain / std::max<int64_t>(c * std::min(inner, kInnerChunk), 1));
  parallel_for(0, outer * chunks, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t job = lo; job < hi; ++job) {
      const int64_t o = job / chunks, i0 = (job % chunks) * kInnerChunk;
      fn(o, i0, std::min(kInnerChunk, inner - i0));
    }
  });
}
}  // namespace

template <class T>
void log_softmax(const T* x, T* out, int64_t outer, int64_t c, int64_t inner) {
  if (c == 0 || outer == 0 || inner == 0) return;
  if (inner == 1) {
    parallel_for(0, outer, row_grain(c), [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        ConstArrayMap<T> row(x + o * c, c);
        ArrayMap<T> y(out + o * c, c);
        const T m = row.maxCoeff();
        y = row - (m + std::log((row - m).exp().sum()));
      }
    });
    return;
  }
  for_each_slice(outer, c, inner, [&](int64_t o, int64_t i0, int64_t len) {
    const T* base = x + o * c * inner + i0;
    auto slice = [&](int64_t k) { return ConstArrayMap<T>(base + k * inner, len); };
    Vec<T> m = slice(0);
    for (int64_t k = 1; k < c; ++k) m = m.max(slice(k));
    Vec<T> s = Vec<T>::Zero(len);
    for (int64_t k = 0; k < c; ++k) s += (slice(k) - m).exp();
    const Vec<T> lse = m + s.log();
    for (int64_t k = 0; k < c; ++k) {
      ArrayMap<T>(out + (o * c + k) * inner + i0, len) = slice(k) - lse;
    }
  });
}

template <class T>
void log_softmax_backward(const T* grad, const T* out, T* grad_in, int64_t outer, int64_t c,
                          int64_t inner) {
  if (c == 0 || outer == 0 || inner == 0) return;
  if (inner == 1) {
    parallel_for(0, outer, row_grain(c), [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        ConstArrayMap<T> g(grad + o * c, c), y(out + o * c, c);
        ArrayMap<T> gi(grad_in + o * c, c);
        gi = g - y.exp() * g.sum();
      }
    });
    return;
  }
  for_each_slice(outer, c, inner, [&](int64_t o, int64_t i0, int64_t len) {
    const int64_t base = o * c * inner + i0;
    Vec<T> s = Vec<T>::Zero(len);
    for (int64_t k = 0; k < c; ++k) s += ConstArrayMap<T>(grad + base + k * inner, len);
    for (int64_t k = 0; k < c; ++k) {
      const int64_t at = base + k * inner;
      ArrayMap<T>(grad_in + at, len) = ConstArrayMap<T>(grad + at, len) - ConstArrayMap<T>(out + at, len).exp() * s;
    }
  });
}

template <class T>
double nll_loss(const T* log_probs, const int64_t* target, int64_t n, int64_t c) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total -= double(log_probs[i * c + target[i]]);
  return total;
}

template <class T>
void nll_loss_backward(const int64_t* target, T* grad_in, int64_t n, int64_t c, T value) {
  std::fill_n(grad_in, n * c, T(0));
  for (int64_t i = 0; i < n; ++i) grad_in[i * c + target[i]] = value;
}

template <class T>
double cross_entropy(const T* logits, const int64_t* target, T* lse, int64_t n, int64_t c,
                     double label_smoothing) {
  std::vector<double> row_loss(size_t(std::max<int64_t>(n, 0)));
  parallel_for(0, n, row_grain(c), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      ConstArrayMap<T> row(logits + i * c, c);
      const T m = row.maxCoeff();
      const T l = m + std::log((row - m).exp().sum());
      lse[i] = l;
      const double nll = double(l) - double(row[target[i]]);
      // mean_j(-log_softmax[i, j]) = lse_i - mean_j x[i, j]
      const double smooth = double(l) - row.template cast<double>().sum() / double(c);
      row_loss[size_t(i)] = (1.0 - label_smoothing) * nll + label_smoothing * smooth;
    }
  });
  double total = 0;
  for (double v : row_loss) total += v;
  return total;
}

template <class T>
void cross_entropy_backward(const T* logits, const int64_t* target, const T* lse, T* grad_in,
                            int64_t n, int64_t c, double label_smoothing, T scale) {
  const T uniform = T(label_smoothing / double(c));
  const T on_target = T(1.0 - label_smoothing);
  parallel_for(0, n, row_grain(c), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      ArrayMap<T> gi(grad_in + i * c, c);
      gi = ((ConstArrayMap<T>(logits + i * c, c) - lse[i]).exp() - uniform) * scale;
      gi[target[i]] -= on_target * scale;
    }
  });
}

#define RG_INSTANTIATE_SOFTMAX(T)                                                           \
  template void log_softmax<T>(const T*, T*, int64_t, int64_t, int64_t);                    \
  template void log_softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t); \
  template double nll_loss<T>(const T*, const int64_t*, int64_t, int64_t);                  \
  template void nll_loss_backward<T>(const int64_t*, T*, int64_t, int64_t, T);              \
  template double cross_entropy<T>(const T*, const int64_t*, T*, int64_t, int64_t, double); \
  template void cross_entropy_backward<T>(const T*, const int64_t*, const T*, T*, int64_t,  \
                                          int64_t, double, T);
RG_INSTANTIATE_SOFTMAX(float)
RG_INSTANTIATE_SOFTMAX(double)
#undef RG_INSTANTIATE_SOFTMAX

}  // namespace rg::kernels::cpu
