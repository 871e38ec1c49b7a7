// Batch-norm loops, parallel over channels: a channel's n * hw values are n runs of hw
// contiguous elements, summed in double so that large batches do not lose precision.
#include "kernels/cpu/batch_norm.h"

#include "kernels/cpu/parallel.h"

namespace rg::kernels::cpu {
namespace {

// Channels per parallel task: enough values that a task outweighs its scheduling.
int64_t channel_grain(int64_t n, int64_t hw) {
  const int64_t per_channel = n * hw;
  return per_channel >= (1 << 12) ? 1 : (1 << 12) / (per_channel + 1) + 1;
}

}  // namespace

template <class T>
void batch_norm_stats(const T* x, int64_t n, int64_t c, int64_t hw, double* mean, double* var) {
  const double count = double(n * hw);
  parallel_for(0, c, channel_grain(n, hw), [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      double sum = 0;
      for (int64_t s = 0; s < n; ++s) {
        const T* p = x + (s * c + ch) * hw;
        for (int64_t i = 0; i < hw; ++i) sum += double(p[i]);
      }
      const double m = sum / count;
      // Second pass around the mean: no cancellation from E[x^2] - E[x]^2.
      double sq = 0;
      for (int64_t s = 0; s < n; ++s) {
        const T* p = x + (s * c + ch) * hw;
        for (int64_t i = 0; i < hw; ++i) {
          const double d = double(p[i]) - m;
          sq += d * d;
        }
      }
      mean[ch] = m;
      var[ch] = sq / count;
    }
  });
}

template <class T>
void batch_norm_apply(const T* x, int64_t n, int64_t c, int64_t hw, const double* mean,
                      const double* invstd, const T* weight, const T* bias, T* y) {
  parallel_for(0, n * c, channel_grain(1, hw), [&](int64_t lo, int64_t hi) {
    for (int64_t job = lo; job < hi; ++job) {
      const int64_t ch = job % c;
      // Centre first, in T: folding the mean into one shift (x * scale + shift) would cancel
      // catastrophically when |mean| is large next to the spread.
      const T m = T(mean[ch]);
      const T scale = T(invstd[ch] * (weight ? double(weight[ch]) : 1.0));
      const T shift = bias ? bias[ch] : T(0);
      const T* p = x + job * hw;
      T* q = y + job * hw;
      for (int64_t i = 0; i < hw; ++i) q[i] = (p[i] - m) * scale + shift;
    }
  });
}

template <class T>
void batch_norm_update_running(T* running_mean, T* running_var, const double* mean,
                               const double* var, int64_t c, int64_t count, double momentum) {
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

template <class T>
void batch_norm_backward(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                         const double* mean, const double* invstd, const T* weight,
                         bool batch_stats, T* gx, T* gweight, T* gbias) {
  const double count = double(n * hw);
  parallel_for(0, c, channel_grain(n, hw), [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      const double m = mean[ch], is = invstd[ch];
      // sum(gy) and sum(gy * xhat) with xhat = (x - mean) * invstd.
      double sum_gy = 0, sum_gy_xmu = 0;
      for (int64_t s = 0; s < n; ++s) {
        const T* g = gy + (s * c + ch) * hw;
        const T* p = x + (s * c + ch) * hw;
        for (int64_t i = 0; i < hw; ++i) {
          sum_gy += double(g[i]);
          sum_gy_xmu += double(g[i]) * (double(p[i]) - m);
        }
      }
      const double sum_gy_xhat = sum_gy_xmu * is;
      if (gweight) gweight[ch] = T(sum_gy_xhat);
      if (gbias) gbias[ch] = T(sum_gy);
      if (!gx) continue;
      const double w = weight ? double(weight[ch]) : 1.0;
      // gx = a * gy + b * (x - mean) + d: the training-mode terms fold into b and d.
      double a = w * is, b = 0, d = 0;
      if (batch_stats) {
        b = -w * is * is * sum_gy_xhat / count;
        d = -w * is * sum_gy / count;
      }
      const T ta = T(a), tb = T(b), td = T(d), tm = T(m);
      for (int64_t s = 0; s < n; ++s) {
        const T* g = gy + (s * c + ch) * hw;
        const T* p = x + (s * c + ch) * hw;
        T* q = gx + (s * c + ch) * hw;
        for (int64_t i = 0; i < hw; ++i) q[i] = ta * g[i] + tb * (p[i] - tm) + td;
      }
    }
  });
}

template void batch_norm_stats<float>(const float*, int64_t, int64_t, int64_t, double*, double*);
template void batch_norm_apply<float>(const float*, int64_t, int64_t, int64_t, const double*,
                                      const double*, const float*, const float*, float*);
template void batch_norm_update_running<float>(float*, float*, const double*, const double*,
                                               int64_t, int64_t, double);
template void batch_norm_backward<float>(const float*, const float*, int64_t, int64_t, int64_t,
                                         const double*, const double*, const float*, bool, float*,
                                         float*, float*);
template void batch_norm_stats<double>(const double*, int64_t, int64_t, int64_t, double*, double*);
template void batch_norm_apply<double>(const double*, int64_t, int64_t, int64_t, const double*,
                                       const double*, const double*, const double*, double*);
template void batch_norm_update_running<double>(double*, double*, const double*, const double*,
                                                int64_t, int64_t, double);
template void batch_norm_backward<double>(const double*, const double*, int64_t, int64_t, int64_t,
                                          const double*, const double*, const double*, bool,
                                          double*, double*, double*);

}  // namespace rg::kernels::cpu
