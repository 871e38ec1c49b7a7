// The batch-norm kernels on the CPU (kernels/batch_norm.h): loops parallel over channels, where a
// channel's n * hw values are n runs of hw contiguous elements, summed in f64. With hw == 1 ([N, C]
// inputs and channels-last [N * H * W, C] ones) a channel's values lie c apart: the *_rows loops
// walk rows instead, a block of adjacent channels at a time, each channel summed over the rows in
// order in one f64 accumulator (the order accumulate() gives hw == 1) with the same arithmetic.
#include "kernels/batch_norm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {

// apply's per-channel coefficients in T, y = (x - m) * scale + shift: centre first (folding the
// mean into one shift, x * scale + shift, would cancel catastrophically when |mean| is large next
// to the spread), scale = invstd * weight formed in f64. relu's recomputed mask uses the same.
template <class T>
struct Coefficients {
  T m, scale, shift;
  Coefficients(int64_t ch, const double* mean, const double* invstd, const T* weight, const T* bias)
      : m(T(mean[ch])),
        scale(T(invstd[ch] * (weight ? double(weight[ch]) : 1.0))),
        shift(bias ? bias[ch] : T(0)) {}
};

// Channels per parallel task: enough values that a task outweighs its scheduling.
int64_t channel_grain(int64_t n, int64_t hw) {
  const int64_t per_channel = n * hw;
  return per_channel >= (1 << 12) ? 1 : (1 << 12) / (per_channel + 1) + 1;
}

// Per-channel sums in f64 with kLanes independent accumulators, added up at the end: one
// accumulator makes every add wait for the previous one (the compiler may not reorder
// floating-point adds), lanes let it vectorize. The result differs from a single running sum
// only in the last bits of the f64 total.
constexpr int kLanes = 8;
struct Lanes {
  double v[kLanes] = {};
  double total() const {
    double t = 0;
    for (double x : v) t += x;
    return t;
  }
};
// acc += f(i) for i in [0, hw); f may also add into other Lanes itself (f(i, lane)).
template <class F>
void accumulate(int64_t hw, Lanes& acc, F&& f) {
  int64_t i = 0;
  for (; i + kLanes <= hw; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc.v[j] += f(i + j, j);
  }
  for (; i < hw; ++i) acc.v[i % kLanes] += f(i, int(i % kLanes));
}

// hw == 1: channels per parallel task (adjacent in each row), and rows per task. The sums (stats,
// backward) walk rows, in parallel over blocks of channels, from kRowsFrom channels on (by_rows):
// fewer share cache lines anyway, and the per-channel loops spread them over more tasks. The
// elementwise loops (apply and the relu mask for any c, the backward's input gradient by_rows)
// walk rows in parallel over rows.
constexpr int64_t kRowChannels = 16;
constexpr int64_t kRowsFrom = 2 * kRowChannels;
bool by_rows(int64_t c, int64_t hw) { return hw == 1 && c >= kRowsFrom; }
int64_t row_grain(int64_t c) { return std::max<int64_t>(1, (1 << 12) / (c + 1)); }

// Per channel j of a block of W adjacent channels (W = kRowChannels, or fewer at the end):
// sum over rows of f(row pointer, j), in row order (so the result does not depend on W). With W
// a constant the sums stay in registers across the rows and the loop over j is one or two
// vector operations; a block narrower than kRowChannels takes the loop with a variable width.
template <int W, class F>
void row_sums(int64_t n, int64_t c, int64_t w, double* out, F&& f) {
  if constexpr (W > 0) {
    double acc[W] = {};
    for (int64_t s = 0; s < n; ++s) {
      for (int j = 0; j < W; ++j) acc[j] += f(s, j);
    }
    for (int j = 0; j < W; ++j) out[j] = acc[j];
  } else {
    std::fill(out, out + w, 0.0);
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t j = 0; j < w; ++j) out[j] += f(s, j);
    }
  }
  (void)c;
}
template <class F>
void block_sums(int64_t n, int64_t c, int64_t w, double* out, F&& f) {
  if (w == kRowChannels) return row_sums<int(kRowChannels)>(n, c, w, out, f);
  row_sums<0>(n, c, w, out, f);
}

// f(lo, hi) for each block of at most kRowChannels channels of [from, to) (a parallel task's
// chunk may hold many).
template <class F>
void for_blocks(int64_t from, int64_t to, F&& f) {
  for (int64_t lo = from; lo < to; lo += kRowChannels) f(lo, std::min(to, lo + kRowChannels));
}

template <class T>
void stats_rows(const T* x, int64_t n, int64_t c, double* mean, double* var, double* invstd,
                double eps, int threads) {
  const double count = double(n);
  cpu::parallel_for(
      0, c, kRowChannels,
      [&](int64_t from, int64_t to) {
        for_blocks(from, to, [&](int64_t lo, int64_t hi) {
          const int64_t w = hi - lo;
          double sum[kRowChannels], sq[kRowChannels], m[kRowChannels];
          const T* base = x + lo;
          block_sums(n, c, w, sum, [&](int64_t s, int64_t j) { return double(base[s * c + j]); });
          for (int64_t j = 0; j < w; ++j) m[j] = sum[j] / count;
          // Second pass around the mean: no cancellation from E[x^2] - E[x]^2.
          block_sums(n, c, w, sq, [&](int64_t s, int64_t j) {
            const double d = double(base[s * c + j]) - m[j];
            return d * d;
          });
          for (int64_t j = 0; j < w; ++j) {
            const int64_t ch = lo + j;
            mean[ch] = m[j];
            var[ch] = sq[j] / count;
            if (invstd) invstd[ch] = 1.0 / std::sqrt(var[ch] + eps);
          }
        });
      },
      threads);
}

// Coefficients<T> of every channel, as three arrays (m, scale, shift).
template <class T>
std::array<std::vector<T>, 3> all_coefficients(int64_t c, const double* mean, const double* invstd,
                                               const T* weight, const T* bias) {
  std::array<std::vector<T>, 3> k;
  for (auto& v : k) v.resize(size_t(c));
  for (int64_t ch = 0; ch < c; ++ch) {
    const auto [m, scale, shift] = Coefficients<T>(ch, mean, invstd, weight, bias);
    k[0][size_t(ch)] = m;
    k[1][size_t(ch)] = scale;
    k[2][size_t(ch)] = shift;
  }
  return k;
}

template <class T>
void apply_rows(const T* x, int64_t n, int64_t c, const double* mean, const double* invstd,
                const T* weight, const T* bias, const T* residual, bool relu, T* y, int threads) {
  const auto [m, scale, shift] = all_coefficients(c, mean, invstd, weight, bias);
  cpu::parallel_for(
      0, n, row_grain(c),
      [&](int64_t lo, int64_t hi) {
        for (int64_t s = lo; s < hi; ++s) {
          const T* p = x + s * c;
          T* q = y + s * c;
          for (int64_t ch = 0; ch < c; ++ch)
            q[ch] = (p[ch] - m[size_t(ch)]) * scale[size_t(ch)] + shift[size_t(ch)];
          if (residual) {
            const T* r = residual + s * c;
            for (int64_t ch = 0; ch < c; ++ch) q[ch] = q[ch] + r[ch];
          }
          if (relu) {
            for (int64_t ch = 0; ch < c; ++ch) q[ch] = q[ch] < T(0) ? T(0) : q[ch];
          }
        }
      },
      threads);
}

}  // namespace

template <>
template <class T>
void BatchNorm<Cpu>::stats(const T* x, int64_t n, int64_t c, int64_t hw, double* mean, double* var,
                           double* invstd, double eps, Workspace, Ctx ctx) {
  detail::check_batch_norm_sizes("batch_norm_stats", n, c, hw);
  RG_CHECK(eps >= 0, "batch_norm_stats: eps must be non-negative, got ", eps);
  if (by_rows(c, hw)) return stats_rows(x, n, c, mean, var, invstd, eps, ctx.threads);
  const double count = double(n * hw);
  cpu::parallel_for(
      0, c, channel_grain(n, hw),
      [&](int64_t lo, int64_t hi) {
        for (int64_t ch = lo; ch < hi; ++ch) {
          Lanes sum;
          for (int64_t s = 0; s < n; ++s) {
            const T* p = x + (s * c + ch) * hw;
            accumulate(hw, sum, [p](int64_t i, int) { return double(p[i]); });
          }
          const double m = sum.total() / count;
          // Second pass around the mean: no cancellation from E[x^2] - E[x]^2.
          Lanes sq;
          for (int64_t s = 0; s < n; ++s) {
            const T* p = x + (s * c + ch) * hw;
            accumulate(hw, sq, [p, m](int64_t i, int) {
              const double d = double(p[i]) - m;
              return d * d;
            });
          }
          mean[ch] = m;
          var[ch] = sq.total() / count;
          if (invstd) invstd[ch] = 1.0 / std::sqrt(var[ch] + eps);
        }
      },
      ctx.threads);
}

template <>
template <class T, class P>
void BatchNorm<Cpu>::apply(const T* x, int64_t n, int64_t c, int64_t hw, const double* mean,
                           const double* invstd, const std::type_identity_t<P>* weight,
                           const std::type_identity_t<P>* bias, const T* residual, bool relu, T* y,
                           Ctx ctx) {
  static_assert(std::is_same_v<T, P>, "the CPU kernels take parameters of the input's type");
  detail::check_batch_norm_sizes("batch_norm_apply", n, c, hw);
  if (hw == 1)
    return apply_rows(x, n, c, mean, invstd, weight, bias, residual, relu, y, ctx.threads);
  cpu::parallel_for(
      0, n * c, channel_grain(1, hw),
      [&](int64_t lo, int64_t hi) {
        for (int64_t job = lo; job < hi; ++job) {
          const auto [m, scale, shift] = Coefficients<T>(job % c, mean, invstd, weight, bias);
          const T* p = x + job * hw;
          T* q = y + job * hw;
          for (int64_t i = 0; i < hw; ++i) q[i] = (p[i] - m) * scale + shift;
          if (residual) {  // after q is rounded to T, as an unfused add sees it
            const T* r = residual + job * hw;
            for (int64_t i = 0; i < hw; ++i) q[i] = q[i] + r[i];
          }
          if (relu) {
            for (int64_t i = 0; i < hw; ++i) q[i] = q[i] < T(0) ? T(0) : q[i];
          }
        }
      },
      ctx.threads);
}

template <>
int64_t BatchNorm<Cpu>::workspace_bytes(int64_t, int64_t, int64_t) {
  return 0;
}

template <>
void BatchNorm<Cpu>::count_batch(int64_t* num_batches_tracked, Ctx) {
  RG_CHECK(num_batches_tracked != nullptr, "batch_norm_count_batch: the counter must not be null");
  *num_batches_tracked += 1;
}

template <>
template <class T>
void BatchNorm<Cpu>::update_running(T* running_mean, T* running_var, const double* mean,
                                    const double* var, int64_t c, int64_t count, double momentum,
                                    Ctx) {
  RG_CHECK(c >= 0 && count >= 0, "batch_norm_update_running: c and count must be non-negative");
  const double unbias = count > 1 ? double(count) / double(count - 1) : 1.0;
  for (int64_t ch = 0; ch < c; ++ch) {
    if (running_mean) {
      running_mean[ch] = T((1 - momentum) * double(running_mean[ch]) + momentum * mean[ch]);
    }
    if (running_var) {
      running_var[ch] = T((1 - momentum) * double(running_var[ch]) + momentum * var[ch] * unbias);
    }
  }
}

namespace {

// Channel ch's sum(gy) and sum(gy * (x - mean)) in one pass.
template <class T>
std::pair<double, double> gradient_sums(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                                        int64_t ch, double m) {
  Lanes gy_lanes, gy_xmu_lanes;
  for (int64_t s = 0; s < n; ++s) {
    const T* g = gy + (s * c + ch) * hw;
    const T* p = x + (s * c + ch) * hw;
    accumulate(hw, gy_xmu_lanes, [g, p, m, &gy_lanes](int64_t i, int lane) {
      const double gv = double(g[i]);
      gy_lanes.v[lane] += gv;
      return gv * (double(p[i]) - m);
    });
  }
  return {gy_lanes.total(), gy_xmu_lanes.total()};
}

// q[i] = g[i] where v[i] > 0, else 0 (g loaded before the select, so that the loop vectorizes).
template <class T>
void keep_where_positive(const T* g, const T* v, T* q, int64_t len) {
  for (int64_t i = 0; i < len; ++i) {
    const T gi = g[i];
    q[i] = v[i] > T(0) ? gi : T(0);
  }
}

// relu_backward of apply(..., relu = true) into out: gy where apply's output (y, or recomputed
// from x with apply's arithmetic in T) is positive, else 0. gy is loaded before the select, so
// the loops vectorize (as relu_backward's keep_where_positive).
template <class T>
void relu_masked(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw, const double* mean,
                 const double* invstd, const T* weight, const T* bias, const T* y, T* out,
                 int threads) {
  if (hw == 1) {
    // Rows of c channels. The test of y is outside the loops and the coefficients are restrict
    // pointers (they alias nothing), so that each row's loop is a branch-free vector select (with
    // the test inside, the compiler made it a scalar loop with a branch per element, about ten
    // times slower).
    const auto [m, scale, shift] = all_coefficients(c, mean, invstd, weight, bias);
    const T* __restrict mp = m.data();
    const T* __restrict sp = scale.data();
    const T* __restrict hp = shift.data();
    cpu::parallel_for(
        0, n, row_grain(c),
        [&](int64_t lo, int64_t hi) {
          for (int64_t s = lo; s < hi; ++s) {
            const T* g = gy + s * c;
            T* q = out + s * c;
            if (y) {
              keep_where_positive(g, y + s * c, q, c);
            } else {
              const T* p = x + s * c;
              for (int64_t ch = 0; ch < c; ++ch) {
                const T gi = g[ch];
                q[ch] = (p[ch] - mp[ch]) * sp[ch] + hp[ch] > T(0) ? gi : T(0);
              }
            }
          }
        },
        threads);
    return;
  }
  cpu::parallel_for(
      0, n * c, channel_grain(1, hw),
      [&](int64_t lo, int64_t hi) {
        for (int64_t job = lo; job < hi; ++job) {
          const auto [m, scale, shift] = Coefficients<T>(job % c, mean, invstd, weight, bias);
          const T* g = gy + job * hw;
          const T* p = x + job * hw;
          T* q = out + job * hw;
          if (y) {
            keep_where_positive(g, y + job * hw, q, hw);
          } else {
            for (int64_t i = 0; i < hw; ++i) {
              const T gi = g[i];
              q[i] = (p[i] - m) * scale + shift > T(0) ? gi : T(0);
            }
          }
        }
      },
      threads);
}

// Channel ch's gx = a * gy + b * (x - mean) + d, with the coefficients of weight w, invstd is,
// and (batch statistics) sum(gy), sum(gy * xhat) over count values formed in f64 and rounded once
// to T: the training-mode terms fold into b and d.
template <class T>
void input_gradient(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw, int64_t ch, double m,
                    double is, double w, bool batch_stats, double sum_gy, double sum_gy_xhat,
                    double count, T* gx) {
  const double a = w * is;
  const double b = batch_stats ? -w * is * is * sum_gy_xhat / count : 0.0;
  const double d = batch_stats ? -w * is * sum_gy / count : 0.0;
  const T ta = T(a), tb = T(b), td = T(d), tm = T(m);
  for (int64_t s = 0; s < n; ++s) {
    const T* g = gy + (s * c + ch) * hw;
    const T* p = x + (s * c + ch) * hw;
    T* q = gx + (s * c + ch) * hw;
    for (int64_t i = 0; i < hw; ++i) q[i] = ta * g[i] + tb * (p[i] - tm) + td;
  }
}

// hw == 1: backward's per-channel sums (gradient_sums), for a block of adjacent channels at a
// time walking rows, then the input gradient (input_gradient's arithmetic) over whole rows, in
// parallel over rows: a block's second walk over its rows would read them again from memory
// (a 32x32 map of 64 channels at batch 32 is 8 MiB of gy and x), a row's is contiguous.
template <class T>
void backward_rows(const T* gy, const T* x, int64_t n, int64_t c, const double* mean,
                   const double* invstd, const T* weight, bool batch_stats, T* gx, T* gweight,
                   T* gbias, int threads) {
  const double count = double(n);
  std::vector<T> ta(static_cast<size_t>(c)), tb(ta), td(ta), tm(ta);
  cpu::parallel_for(
      0, c, kRowChannels,
      [&](int64_t from, int64_t to) {
        for_blocks(from, to, [&](int64_t lo, int64_t hi) {
          const size_t w = size_t(hi - lo);
          double sum_gy[kRowChannels], sum_gy_xmu[kRowChannels], m[kRowChannels];
          for (size_t j = 0; j < w; ++j) m[j] = mean[lo + int64_t(j)];
          const T* g0 = gy + lo;
          const T* p0 = x + lo;
          // Both sums in one pass over the rows, in registers when the block is full (as
          // row_sums).
          auto sums = [&]<int W>(int64_t width) {
            double a[kRowChannels] = {}, b[kRowChannels] = {};
            const int64_t cols = W > 0 ? W : width;
            for (int64_t s = 0; s < n; ++s) {
              const T* g = g0 + s * c;
              const T* p = p0 + s * c;
              for (int64_t j = 0; j < cols; ++j) {
                const double gv = double(g[j]);
                a[j] += gv;
                b[j] += gv * (double(p[j]) - m[j]);
              }
            }
            std::copy(a, a + cols, sum_gy);
            std::copy(b, b + cols, sum_gy_xmu);
          };
          if (int64_t(w) == kRowChannels) {
            sums.template operator()<int(kRowChannels)>(int64_t(w));
          } else {
            sums.template operator()<0>(int64_t(w));
          }
          for (size_t j = 0; j < w; ++j) {
            const int64_t ch = lo + int64_t(j);
            const double is = invstd[ch], sum_gy_xhat = sum_gy_xmu[j] * is;
            if (gweight) gweight[ch] = T(sum_gy_xhat);
            if (gbias) gbias[ch] = T(sum_gy[j]);
            const double wv = weight ? double(weight[ch]) : 1.0;
            ta[size_t(ch)] = T(wv * is);
            tb[size_t(ch)] = T(batch_stats ? -wv * is * is * sum_gy_xhat / count : 0.0);
            td[size_t(ch)] = T(batch_stats ? -wv * is * sum_gy[j] / count : 0.0);
            tm[size_t(ch)] = T(mean[ch]);
          }
        });
      },
      threads);
  if (!gx) return;
  const T* __restrict a = ta.data();
  const T* __restrict b = tb.data();
  const T* __restrict d = td.data();
  const T* __restrict mu = tm.data();
  cpu::parallel_for(
      0, n, row_grain(c),
      [&](int64_t lo, int64_t hi) {
        for (int64_t s = lo; s < hi; ++s) {
          const T* g = gy + s * c;
          const T* p = x + s * c;
          T* q = gx + s * c;
          for (int64_t j = 0; j < c; ++j) q[j] = a[j] * g[j] + b[j] * (p[j] - mu[j]) + d[j];
        }
      },
      threads);
}

}  // namespace

template <>
template <class T, class P>
void BatchNorm<Cpu>::backward(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                              const double* mean, const double* invstd,
                              const std::type_identity_t<P>* weight,
                              const std::type_identity_t<P>* bias, const T* y, bool batch_stats,
                              bool relu, T* gx, std::type_identity_t<P>* gweight,
                              std::type_identity_t<P>* gbias, T* gresidual, Workspace, Ctx ctx) {
  static_assert(std::is_same_v<T, P>, "the CPU kernels take parameters of the input's type");
  detail::check_batch_norm_sizes("batch_norm_backward", n, c, hw);
  const double count = double(n * hw);
  // relu: its backward first, into the residual's gradient (which it is; callers that do not
  // want it may still pass a buffer there, as the ops do) or a buffer of our own, then the plain
  // backward of that: the composition relu_backward then backward, by construction.
  std::vector<T> masked;
  if (relu) {
    T* out = gresidual;
    if (!out) {
      masked.resize(static_cast<size_t>(n * c * hw));
      out = masked.data();
    }
    relu_masked(gy, x, n, c, hw, mean, invstd, weight, bias, y, out, ctx.threads);
    gy = out;
  } else if (gresidual) {
    std::copy(gy, gy + n * c * hw, gresidual);
  }
  if (by_rows(c, hw)) {
    backward_rows(gy, x, n, c, mean, invstd, weight, batch_stats, gx, gweight, gbias, ctx.threads);
    return;
  }
  cpu::parallel_for(
      0, c, channel_grain(n, hw),
      [&](int64_t lo, int64_t hi) {
        for (int64_t ch = lo; ch < hi; ++ch) {
          const double m = mean[ch], is = invstd[ch];
          // sum(gy) and sum(gy * xhat) with xhat = (x - mean) * invstd.
          const auto [sum_gy, sum_gy_xmu] = gradient_sums(gy, x, n, c, hw, ch, m);
          const double sum_gy_xhat = sum_gy_xmu * is;
          if (gweight) gweight[ch] = T(sum_gy_xhat);
          if (gbias) gbias[ch] = T(sum_gy);
          if (!gx) continue;
          input_gradient(gy, x, n, c, hw, ch, m, is, weight ? double(weight[ch]) : 1.0, batch_stats,
                         sum_gy, sum_gy_xhat, count, gx);
        }
      },
      ctx.threads);
}

template <>
template <class T>
void BatchNorm<Cpu>::backward_reduce(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                                     const double* mean, const double* invstd, double* sums,
                                     Ctx ctx) {
  detail::check_batch_norm_sizes("batch_norm_backward_reduce", n, c, hw);
  cpu::parallel_for(
      0, c, channel_grain(n, hw),
      [&](int64_t lo, int64_t hi) {
        for (int64_t ch = lo; ch < hi; ++ch) {
          const auto [sum_gy, sum_gy_xmu] = gradient_sums(gy, x, n, c, hw, ch, mean[ch]);
          sums[ch] = sum_gy;
          sums[c + ch] = sum_gy_xmu * invstd[ch];
        }
      },
      ctx.threads);
}

template <>
template <class T>
void BatchNorm<Cpu>::backward_elemt(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                                    const double* mean, const double* invstd, const T* weight,
                                    const double* sums, int64_t count, T* gx, Ctx ctx) {
  detail::check_batch_norm_sizes("batch_norm_backward_elemt", n, c, hw);
  RG_CHECK(count > 0, "batch_norm_backward_elemt: count must be positive, got ", count);
  cpu::parallel_for(
      0, c, channel_grain(n, hw),
      [&](int64_t lo, int64_t hi) {
        for (int64_t ch = lo; ch < hi; ++ch) {
          input_gradient(gy, x, n, c, hw, ch, mean[ch], invstd[ch],
                         weight ? double(weight[ch]) : 1.0, true, sums[ch], sums[c + ch],
                         double(count), gx);
        }
      },
      ctx.threads);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_batch_norm_kernels() {
  using K = BatchNorm<Cpu>;
  return std::tuple{&K::stats<T>,    &K::apply<T>,           &K::update_running<T>,
                    &K::backward<T>, &K::backward_reduce<T>, &K::backward_elemt<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_batch_norm_kernels)

}  // namespace rg::kernels
