// The layer-norm kernels on the CPU (kernels/layer_norm.h): the forward and the input gradient run
// rows in parallel, a row's sums in kLanes independent accumulators (vectorizable); the weight and
// bias gradients run chunks of columns in parallel, each column summing its rows in order in f64.
#include "kernels/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {

// Rows (or columns) per parallel task: enough values that a task outweighs its scheduling.
int64_t grain_for(int64_t per_item) {
  return per_item >= (1 << 12) ? 1 : (1 << 12) / (per_item + 1) + 1;
}

// sum_j f(j) over [0, d) in kLanes accumulators of type A, added up at the end: one accumulator
// makes every add wait for the previous one, lanes let the compiler vectorize.
constexpr int kLanes = 8;
template <class A, class F>
A lane_sum(int64_t d, F&& f) {
  A acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= d; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += f(j + l);
  }
  for (; j < d; ++j) acc[j % kLanes] += f(j);
  A total = 0;
  for (A v : acc) total += v;
  return total;
}

}  // namespace

template <>
template <class T>
void LayerNorm<Cpu>::forward(const T* x, int64_t rows, int64_t d, const T* weight, const T* bias,
                             double eps, T* y, LayerNormStat<T>* mean, LayerNormStat<T>* rstd,
                             Ctx ctx) {
  using A = LayerNormStat<T>;
  detail::check_layer_norm_sizes("layer_norm", rows, d);
  RG_CHECK(eps >= 0, "layer_norm: eps must be non-negative, got ", eps);
  cpu::parallel_for(
      0, rows, grain_for(d),
      [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const T* p = x + r * d;
          T* q = y + r * d;
          const A m = lane_sum<A>(d, [p](int64_t j) { return A(p[j]); }) / A(d);
          // Second pass around the mean: no cancellation from E[x^2] - E[x]^2.
          const A var = lane_sum<A>(d,
                                    [p, m](int64_t j) {
                                      const A c = A(p[j]) - m;
                                      return c * c;
                                    }) /
                        A(d);
          const A is = A(1.0 / std::sqrt(double(var) + eps));
          mean[r] = m;
          rstd[r] = is;
          if (weight && bias) {
            for (int64_t j = 0; j < d; ++j)
              q[j] = T((A(p[j]) - m) * is * A(weight[j]) + A(bias[j]));
          } else if (weight) {
            for (int64_t j = 0; j < d; ++j) q[j] = T((A(p[j]) - m) * is * A(weight[j]));
          } else if (bias) {
            for (int64_t j = 0; j < d; ++j) q[j] = T((A(p[j]) - m) * is + A(bias[j]));
          } else {
            for (int64_t j = 0; j < d; ++j) q[j] = T((A(p[j]) - m) * is);
          }
        }
      },
      ctx.threads);
}

template <>
int64_t LayerNorm<Cpu>::backward_workspace_bytes(int64_t, int64_t) {
  return 0;
}

template <>
template <class T>
void LayerNorm<Cpu>::backward(const T* gy, const T* x, int64_t rows, int64_t d,
                              const LayerNormStat<T>* mean, const LayerNormStat<T>* rstd,
                              const T* weight, T* gx, T* gweight, T* gbias, Workspace, Ctx ctx) {
  using A = LayerNormStat<T>;
  detail::check_layer_norm_sizes("layer_norm_backward", rows, d);
  if (gx) {
    cpu::parallel_for(
        0, rows, grain_for(d),
        [&](int64_t lo, int64_t hi) {
          for (int64_t r = lo; r < hi; ++r) {
            const T* g = gy + r * d;
            const T* p = x + r * d;
            T* q = gx + r * d;
            const A m = mean[r], is = rstd[r];
            const auto gw = [g, weight](int64_t j) {
              return weight ? A(g[j]) * A(weight[j]) : A(g[j]);
            };
            const A sum_g = lane_sum<A>(d, gw);
            const A sum_g_xhat =
                lane_sum<A>(d, [&](int64_t j) { return gw(j) * (A(p[j]) - m); }) * is;
            const A mean_g = sum_g / A(d), mean_g_xhat = sum_g_xhat / A(d);
            for (int64_t j = 0; j < d; ++j) {
              const A xhat = (A(p[j]) - m) * is;
              q[j] = T(is * (gw(j) - mean_g - xhat * mean_g_xhat));
            }
          }
        },
        ctx.threads);
  }
  if (!gweight && !gbias) return;
  cpu::parallel_for(
      0, d, std::max<int64_t>(64, grain_for(rows)),
      [&](int64_t lo, int64_t hi) {
        const int64_t w = hi - lo;
        std::vector<double> sw(size_t(w), 0.0), sb(size_t(w), 0.0);
        for (int64_t r = 0; r < rows; ++r) {
          const T* g = gy + r * d + lo;
          const T* p = x + r * d + lo;
          const double m = double(mean[r]), is = double(rstd[r]);
          for (int64_t j = 0; j < w; ++j) {
            const double gv = double(g[j]);
            sw[size_t(j)] += gv * ((double(p[j]) - m) * is);
            sb[size_t(j)] += gv;
          }
        }
        for (int64_t j = 0; j < w; ++j) {
          if (gweight) gweight[lo + j] = T(sw[size_t(j)]);
          if (gbias) gbias[lo + j] = T(sb[size_t(j)]);
        }
      },
      ctx.threads);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_layer_norm_kernels() {
  using K = LayerNorm<Cpu>;
  return std::tuple{&K::forward<T>, &K::backward<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_layer_norm_kernels)

}  // namespace rg::kernels
