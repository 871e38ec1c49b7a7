// The loss kernels on the CPU (kernels/loss.h), with Eigen maps. Rows (inner == 1) are the fast
// path; other dimensions run over contiguous inner slices so the loops stay vectorizable. Per-row
// losses go to the workspace and are summed in f64 in row order, so results do not depend on the
// thread count.
#include "kernels/loss.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "kernels/cpu/eigen_maps.h"
#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {
using cpu::ArrayMap;
using cpu::ConstArrayMap;
template <class T>
using Vec = Eigen::Array<T, Eigen::Dynamic, 1>;
constexpr int64_t kGrain = 1 << 14;  // elements per parallel chunk
constexpr int64_t kInnerChunk = 1024;

int64_t row_grain(int64_t c) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(c, 1)); }

// Runs fn(o, i0, len) over every (outer index, slice [i0, i0 + len) of inner) in parallel.
template <class F>
void for_each_slice(int64_t outer, int64_t c, int64_t inner, Ctx ctx, F&& fn) {
  const int64_t chunks = (inner + kInnerChunk - 1) / kInnerChunk;
  const int64_t grain =
      std::max<int64_t>(1, kGrain / std::max<int64_t>(c * std::min(inner, kInnerChunk), 1));
  cpu::parallel_for(
      0, outer * chunks, grain,
      [&](int64_t lo, int64_t hi) {
        for (int64_t job = lo; job < hi; ++job) {
          const int64_t o = job / chunks, i0 = (job % chunks) * kInnerChunk;
          fn(o, i0, std::min(kInnerChunk, inner - i0));
        }
      },
      ctx.threads);
}

// Runs fn(o) for every row o of an inner == 1 array, in parallel.
template <class F>
void for_each_row(int64_t rows, int64_t c, Ctx ctx, F&& fn) {
  cpu::parallel_for(
      0, rows, row_grain(c),
      [&](int64_t lo, int64_t hi) {
        for (int64_t o = lo; o < hi; ++o) fn(o);
      },
      ctx.threads);
}

bool valid_target(int64_t t, int64_t c) { return t >= 0 && t < c; }

// first_bad = {the smallest row whose target is out of [0, c), its target}, or {n, 0}.
void find_first_bad(const int64_t* target, int64_t n, int64_t c, int64_t* first_bad) {
  first_bad[0] = n;
  first_bad[1] = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!valid_target(target[i], c)) {
      first_bad[0] = i;
      first_bad[1] = target[i];
      return;
    }
  }
}

// softmax (log_out false) or log_softmax of x along c.
template <class T>
void softmax_forward(const T* x, T* out, int64_t outer, int64_t c, int64_t inner, bool log_out,
                     Ctx ctx) {
  if (c == 0 || outer == 0 || inner == 0) return;
  if (inner == 1) {
    for_each_row(outer, c, ctx, [&](int64_t o) {
      ConstArrayMap<T> row(x + o * c, c);
      ArrayMap<T> y(out + o * c, c);
      const T m = row.maxCoeff();
      if (log_out) {
        y = row - (m + std::log((row - m).exp().sum()));
      } else {
        y = (row - m).exp();
        y /= y.sum();
      }
    });
    return;
  }
  for_each_slice(outer, c, inner, ctx, [&](int64_t o, int64_t i0, int64_t len) {
    const T* base = x + o * c * inner + i0;
    auto slice = [&](int64_t k) { return ConstArrayMap<T>(base + k * inner, len); };
    Vec<T> m = slice(0);
    for (int64_t k = 1; k < c; ++k) m = m.max(slice(k));
    Vec<T> s = Vec<T>::Zero(len);
    for (int64_t k = 0; k < c; ++k) s += (slice(k) - m).exp();
    const Vec<T> lse = m + s.log();
    for (int64_t k = 0; k < c; ++k) {
      ArrayMap<T> y(out + (o * c + k) * inner + i0, len);
      if (log_out) {
        y = slice(k) - lse;
      } else {
        y = (slice(k) - m).exp() / s;
      }
    }
  });
}

// log: grad_in = g - exp(y) * sum(g); softmax: grad_in = y * (g - sum(g * y)).
template <class T>
void softmax_grad(const T* grad, const T* out, T* grad_in, int64_t outer, int64_t c, int64_t inner,
                  bool log_out, Ctx ctx) {
  if (c == 0 || outer == 0 || inner == 0) return;
  if (inner == 1) {
    for_each_row(outer, c, ctx, [&](int64_t o) {
      ConstArrayMap<T> g(grad + o * c, c), y(out + o * c, c);
      ArrayMap<T> gi(grad_in + o * c, c);
      if (log_out) {
        gi = g - y.exp() * g.sum();
      } else {
        gi = y * (g - (g * y).sum());
      }
    });
    return;
  }
  for_each_slice(outer, c, inner, ctx, [&](int64_t o, int64_t i0, int64_t len) {
    const int64_t base = o * c * inner + i0;
    auto g = [&](int64_t k) { return ConstArrayMap<T>(grad + base + k * inner, len); };
    auto y = [&](int64_t k) { return ConstArrayMap<T>(out + base + k * inner, len); };
    Vec<T> s = Vec<T>::Zero(len);
    for (int64_t k = 0; k < c; ++k) s += log_out ? Vec<T>(g(k)) : Vec<T>(g(k) * y(k));
    for (int64_t k = 0; k < c; ++k) {
      ArrayMap<T> gi(grad_in + base + k * inner, len);
      if (log_out) {
        gi = g(k) - y(k).exp() * s;
      } else {
        gi = y(k) * (g(k) - s);
      }
    }
  });
}
}  // namespace

template <>
template <class T>
void Loss<Cpu>::log_softmax(const T* x, T* out, int64_t outer, int64_t c, int64_t inner, Ctx ctx) {
  detail::check_softmax_sizes("log_softmax", outer, c, inner);
  softmax_forward(x, out, outer, c, inner, true, ctx);
}

template <>
template <class T>
void Loss<Cpu>::log_softmax_backward(const T* grad, const T* out, T* grad_in, int64_t outer,
                                     int64_t c, int64_t inner, Ctx ctx) {
  detail::check_softmax_sizes("log_softmax_backward", outer, c, inner);
  softmax_grad(grad, out, grad_in, outer, c, inner, true, ctx);
}

template <>
template <class T>
void Loss<Cpu>::softmax(const T* x, T* out, int64_t outer, int64_t c, int64_t inner, Ctx ctx) {
  detail::check_softmax_sizes("softmax", outer, c, inner);
  softmax_forward(x, out, outer, c, inner, false, ctx);
}

template <>
template <class T>
void Loss<Cpu>::softmax_backward(const T* grad, const T* out, T* grad_in, int64_t outer, int64_t c,
                                 int64_t inner, Ctx ctx) {
  detail::check_softmax_sizes("softmax_backward", outer, c, inner);
  softmax_grad(grad, out, grad_in, outer, c, inner, false, ctx);
}

template <>
template <class T>
void Loss<Cpu>::nll_loss(const T* log_probs, const int64_t* target, T* loss, int64_t* first_bad,
                         int64_t n, int64_t c, Ctx) {
  detail::check_loss_rows("nll_loss", n, c);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    total -= valid_target(target[i], c) ? double(log_probs[i * c + target[i]]) : NAN;
  }
  loss[0] = T(total / double(n));
  find_first_bad(target, n, c, first_bad);
}

template <>
template <class T>
void Loss<Cpu>::nll_loss_backward(const int64_t* target, const T* grad_loss, T* grad_in, int64_t n,
                                  int64_t c, Ctx) {
  detail::check_loss_rows("nll_loss_backward", n, c);
  const T value = T(-double(grad_loss[0]) / double(n));
  std::fill_n(grad_in, n * c, T(0));
  for (int64_t i = 0; i < n; ++i) {
    if (valid_target(target[i], c)) grad_in[i * c + target[i]] = value;
  }
}

template <>
template <class T>
void Loss<Cpu>::cross_entropy(const T* logits, const int64_t* target, T* lse, T* loss,
                              int64_t* first_bad, int64_t n, int64_t c, double label_smoothing,
                              Workspace workspace, Ctx ctx) {
  detail::check_loss_rows("cross_entropy", n, c);
  detail::check_label_smoothing("cross_entropy", label_smoothing);
  detail::check_workspace("cross_entropy", workspace, cross_entropy_workspace_bytes(n));
  double* row_loss = static_cast<double*>(workspace.data);
  for_each_row(n, c, ctx, [&](int64_t i) {
    ConstArrayMap<T> row(logits + i * c, c);
    const T m = row.maxCoeff();
    const T l = m + std::log((row - m).exp().sum());
    lse[i] = l;
    const int64_t t = target[i];
    const T nll = valid_target(t, c) ? l - row[t] : T(NAN);
    // mean_j(-log_softmax[i, j]) = lse_i - mean_j x[i, j]
    const T smooth = l - row.sum() / T(c);
    row_loss[i] = (1.0 - label_smoothing) * double(nll) + label_smoothing * double(smooth);
  });
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += row_loss[i];
  loss[0] = T(total / double(n));
  find_first_bad(target, n, c, first_bad);
}

template <>
template <class T>
void Loss<Cpu>::cross_entropy_backward(const T* logits, const int64_t* target, const T* lse,
                                       const T* grad_loss, T* grad_in, int64_t n, int64_t c,
                                       double label_smoothing, Ctx ctx) {
  detail::check_loss_rows("cross_entropy_backward", n, c);
  detail::check_label_smoothing("cross_entropy_backward", label_smoothing);
  const T scale = T(double(grad_loss[0]) / double(n));
  const T uniform = T(label_smoothing / double(c));
  const T on_target = T(1.0 - label_smoothing);
  for_each_row(n, c, ctx, [&](int64_t i) {
    ArrayMap<T> gi(grad_in + i * c, c);
    gi = ((ConstArrayMap<T>(logits + i * c, c) - lse[i]).exp() - uniform) * scale;
    if (valid_target(target[i], c)) gi[target[i]] -= on_target * scale;
  });
}

namespace {

// The mean over i < n of term(i) (an f64 value) as the regression losses take it: summed over
// `blocks` contiguous chunks in parallel (into partial[0, blocks)), then the chunks in order.
template <class F>
double chunked_mean(int64_t n, int64_t blocks, double* partial, Ctx ctx, F&& term) {
  cpu::parallel_for(
      0, blocks, 1,
      [&](int64_t lo, int64_t hi) {
        for (int64_t b = lo; b < hi; ++b) {
          double acc = 0;
          for (int64_t i = n * b / blocks; i < n * (b + 1) / blocks; ++i) acc += term(i);
          partial[b] = acc;
        }
      },
      ctx.threads);
  double total = 0;
  for (int64_t b = 0; b < blocks; ++b) total += partial[b];
  return total / double(n);
}

}  // namespace

template <>
template <class T>
void Loss<Cpu>::mse_loss(const T* x, const T* y, T* loss, int64_t n, Workspace workspace, Ctx ctx) {
  RG_CHECK(n >= 0, "mse_loss: n must be non-negative, got ", n);
  detail::check_workspace("mse_loss", workspace, mse_loss_workspace_bytes(n));
  loss[0] =
      T(chunked_mean(n, kMseBlocks, static_cast<double*>(workspace.data), ctx, [&](int64_t i) {
        const double d = double(x[i]) - double(y[i]);
        return d * d;
      }));
}

template <>
template <class T>
void Loss<Cpu>::mse_loss_backward(const T* x, const T* y, const T* grad_loss, T* gx, T* gy,
                                  int64_t n, Ctx ctx) {
  RG_CHECK(n >= 0, "mse_loss_backward: n must be non-negative, got ", n);
  const T scale = T(2.0 * double(grad_loss[0]) / double(n));
  cpu::parallel_for(
      0, n, kGrain,
      [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const T g = (x[i] - y[i]) * scale;
          if (gx) gx[i] = g;
          if (gy) gy[i] = -g;
        }
      },
      ctx.threads);
}

template <>
template <class T>
void Loss<Cpu>::smooth_l1_loss(const T* x, const T* y, T* loss, int64_t n, double beta,
                               Workspace workspace, Ctx ctx) {
  detail::check_smooth_l1_beta("smooth_l1_loss", n, beta);
  detail::check_workspace("smooth_l1_loss", workspace, smooth_l1_loss_workspace_bytes(n));
  loss[0] =
      T(chunked_mean(n, kMseBlocks, static_cast<double*>(workspace.data), ctx, [&](int64_t i) {
        const double d = std::abs(double(x[i]) - double(y[i]));
        return d < beta ? 0.5 * d * d / beta : d - 0.5 * beta;
      }));
}

template <>
template <class T>
void Loss<Cpu>::smooth_l1_loss_backward(const T* x, const T* y, const T* grad_loss, T* gx, T* gy,
                                        int64_t n, double beta, Ctx ctx) {
  detail::check_smooth_l1_beta("smooth_l1_loss_backward", n, beta);
  const T scale = T(double(grad_loss[0]) / double(n));
  const T b = T(beta);
  cpu::parallel_for(
      0, n, kGrain,
      [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const T d = x[i] - y[i];
          const T slope = std::abs(d) < b ? d / b : T((d > T(0)) - (d < T(0)));
          const T g = slope * scale;
          if (gx) gx[i] = g;
          if (gy) gy[i] = -g;
        }
      },
      ctx.threads);
}

// Not in an unnamed namespace: an internal function that nothing calls need not be emitted, and
// with it the kernels it names. The name says the backend: the CUDA file has its own list.
template <class T>
auto cpu_loss_kernels() {
  using K = Loss<Cpu>;
  return std::tuple{&K::log_softmax<T>,    &K::log_softmax_backward<T>,
                    &K::softmax<T>,        &K::softmax_backward<T>,
                    &K::nll_loss<T>,       &K::nll_loss_backward<T>,
                    &K::cross_entropy<T>,  &K::cross_entropy_backward<T>,
                    &K::mse_loss<T>,       &K::mse_loss_backward<T>,
                    &K::smooth_l1_loss<T>, &K::smooth_l1_loss_backward<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_loss_kernels)

}  // namespace rg::kernels
