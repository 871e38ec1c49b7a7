// The batch-norm kernels on CUDA (kernels/batch_norm.h). Statistics and the backward take one
// block per channel: a channel's n * hw values are n runs of hw contiguous elements, summed in f64
// with warp shuffles then shared memory (a fixed tree); normalization is elementwise in the
// compute type, from per-channel coefficients formed in f64.
#include <algorithm>
#include <cstdint>
#include <tuple>

#include "kernels/batch_norm.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::kernels {
namespace {

using cuda::detail::compute_t;

using cuda::detail::as_stream;
using cuda::detail::block_sum;
using cuda::detail::blocks_for;
using cuda::detail::dev;
using cuda::detail::device_t;
using cuda::detail::grid_start;
using cuda::detail::grid_stride;
using cuda::detail::kFullMask;
using cuda::detail::kThreads;
using cuda::detail::load;
using cuda::detail::store;
using cuda::detail::warp_sum;

constexpr unsigned int kChannelThreads = 512;  // at most, per channel block
constexpr int64_t kMaxGrid = 65535;            // channel loops cover the rest

// Element j of channel ch's m = n * hw values.
__device__ __forceinline__ int64_t channel_index(int64_t j, int64_t ch, int64_t c, int64_t hw) {
  return (j / hw * c + ch) * hw + j % hw;
}

template <class D>
__global__ void stats_kernel(const D* x, int64_t n, int64_t c, int64_t hw, double* mean,
                             double* var, double* invstd, double eps) {
  __shared__ double scratch[32];
  const int64_t m = n * hw;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    double sum = 0;
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x)
      sum += static_cast<double>(load(x[channel_index(j, ch, c, hw)]));
    const double mu = block_sum(sum, scratch) / static_cast<double>(m);
    // Second pass around the mean: no cancellation from E[x^2] - E[x]^2.
    double sq = 0;
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
      const double d = static_cast<double>(load(x[channel_index(j, ch, c, hw)])) - mu;
      sq += d * d;
    }
    const double v = block_sum(sq, scratch) / static_cast<double>(m);
    if (threadIdx.x == 0) {
      mean[ch] = mu;
      var[ch] = v;
      if (invstd) invstd[ch] = 1.0 / sqrt(v + eps);
    }
  }
}

template <class D>
__global__ void apply_kernel(const D* x, int64_t c, int64_t hw, int64_t total, const double* mean,
                             const double* invstd, const D* weight, const D* bias, D* y) {
  using A = compute_t<D>;
  for (int64_t idx = grid_start(); idx < total; idx += grid_stride()) {
    const int64_t ch = idx / hw % c;
    // Centre first: folding the mean into one shift would cancel when |mean| is large.
    const A m = static_cast<A>(mean[ch]);
    const A scale = static_cast<A>(invstd[ch] * (weight ? static_cast<double>(load(weight[ch])) : 1.0));
    const A shift = bias ? load(bias[ch]) : A(0);
    y[idx] = store<D>((load(x[idx]) - m) * scale + shift);
  }
}

template <class D>
__global__ void update_running_kernel(D* running_mean, D* running_var, const double* mean,
                                      const double* var, int64_t c, double unbias,
                                      double momentum) {
  for (int64_t ch = grid_start(); ch < c; ch += grid_stride()) {
    if (running_mean) {
      running_mean[ch] = store<D>((1 - momentum) * static_cast<double>(load(running_mean[ch])) +
                                  momentum * mean[ch]);
    }
    if (running_var) {
      running_var[ch] = store<D>((1 - momentum) * static_cast<double>(load(running_var[ch])) +
                                 momentum * var[ch] * unbias);
    }
  }
}

// Channel ch's sum(gy) and sum(gy * (x - mean)), block-reduced (every thread gets the totals).
template <class D>
__device__ void gradient_sums(const D* gy, const D* x, int64_t m, int64_t ch, int64_t c, int64_t hw,
                              double mu, double* scratch, double& sum_gy, double& sum_gy_xmu) {
  sum_gy = 0;
  sum_gy_xmu = 0;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    const int64_t at = channel_index(j, ch, c, hw);
    const double g = static_cast<double>(load(gy[at]));
    sum_gy += g;
    sum_gy_xmu += g * (static_cast<double>(load(x[at])) - mu);
  }
  sum_gy = block_sum(sum_gy, scratch);
  sum_gy_xmu = block_sum(sum_gy_xmu, scratch);
}

// Channel ch's gx = a * gy + b * (x - mean) + d: the training-mode terms (sum(gy) and
// sum(gy * xhat) over m_d values) fold into b and d, formed in f64 and rounded once to the
// compute type.
template <class D>
__device__ void input_gradient(const D* gy, const D* x, int64_t m, int64_t ch, int64_t c,
                               int64_t hw, double mu, double is, double w, bool batch_stats,
                               double sum_gy, double sum_gy_xhat, double m_d, D* gx) {
  using A = compute_t<D>;
  const A a = static_cast<A>(w * is);
  const A b = static_cast<A>(batch_stats ? -w * is * is * sum_gy_xhat / m_d : 0.0);
  const A d = static_cast<A>(batch_stats ? -w * is * sum_gy / m_d : 0.0);
  const A mu_a = static_cast<A>(mu);
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    const int64_t at = channel_index(j, ch, c, hw);
    gx[at] = store<D>(a * load(gy[at]) + b * (load(x[at]) - mu_a) + d);
  }
}

template <class D>
__global__ void backward_kernel(const D* gy, const D* x, int64_t n, int64_t c, int64_t hw,
                                const double* mean, const double* invstd, const D* weight,
                                bool batch_stats, D* gx, D* gweight, D* gbias) {
  __shared__ double scratch[32];
  const int64_t m = n * hw;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    const double mu = mean[ch], is = invstd[ch];
    // sum(gy) and sum(gy * (x - mean)); xhat = (x - mean) * invstd.
    double sum_gy, sum_gy_xmu;
    gradient_sums(gy, x, m, ch, c, hw, mu, scratch, sum_gy, sum_gy_xmu);
    const double sum_gy_xhat = sum_gy_xmu * is;
    if (threadIdx.x == 0) {
      if (gweight) gweight[ch] = store<D>(sum_gy_xhat);
      if (gbias) gbias[ch] = store<D>(sum_gy);
    }
    if (gx) {
      const double w = weight ? static_cast<double>(load(weight[ch])) : 1.0;
      input_gradient(gy, x, m, ch, c, hw, mu, is, w, batch_stats, sum_gy, sum_gy_xhat,
                     static_cast<double>(m), gx);
    }
  }
}

template <class D>
__global__ void backward_reduce_kernel(const D* gy, const D* x, int64_t n, int64_t c, int64_t hw,
                                       const double* mean, const double* invstd, double* sums) {
  __shared__ double scratch[32];
  const int64_t m = n * hw;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    double sum_gy, sum_gy_xmu;
    gradient_sums(gy, x, m, ch, c, hw, mean[ch], scratch, sum_gy, sum_gy_xmu);
    if (threadIdx.x == 0) {
      sums[ch] = sum_gy;
      sums[c + ch] = sum_gy_xmu * invstd[ch];
    }
  }
}

template <class D>
__global__ void backward_elemt_kernel(const D* gy, const D* x, int64_t n, int64_t c, int64_t hw,
                                      const double* mean, const double* invstd, const D* weight,
                                      const double* sums, double count, D* gx) {
  const int64_t m = n * hw;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    const double w = weight ? static_cast<double>(load(weight[ch])) : 1.0;
    input_gradient(gy, x, m, ch, c, hw, mean[ch], invstd[ch], w, true, sums[ch], sums[c + ch],
                   count, gx);
  }
}

__global__ void count_batch_kernel(int64_t* counter) { *counter += 1; }

unsigned int channel_threads(int64_t m) {
  return static_cast<unsigned int>(std::clamp<int64_t>((m + 31) / 32 * 32, 32, kChannelThreads));
}

unsigned int channel_grid(int64_t c) { return static_cast<unsigned int>(std::min(c, kMaxGrid)); }

}  // namespace

template <>
template <class T>
void BatchNorm<Cuda>::stats(const T* x, int64_t n, int64_t c, int64_t hw, double* mean,
                            double* var, double* invstd, double eps, Ctx ctx) {
  using D = device_t<T>;
  detail::check_batch_norm_sizes("batch_norm_stats", n, c, hw);
  RG_CHECK(eps >= 0, "batch_norm_stats: eps must be non-negative, got ", eps);
  if (c == 0) return;
  RG_CHECK(mean != nullptr && var != nullptr, "batch_norm_stats: mean and var must not be null");
  RG_LAUNCH(stats_kernel<D>, channel_grid(c), channel_threads(n * hw), 0, as_stream(ctx.stream),
            dev(x), n, c, hw, mean, var, invstd, eps);
}

template <>
template <class T>
void BatchNorm<Cuda>::apply(const T* x, int64_t n, int64_t c, int64_t hw, const double* mean,
                            const double* invstd, const T* weight, const T* bias, T* y, Ctx ctx) {
  using D = device_t<T>;
  detail::check_batch_norm_sizes("batch_norm_apply", n, c, hw);
  const int64_t total = n * c * hw;
  if (total == 0) return;
  RG_LAUNCH(apply_kernel<D>, blocks_for(total), kThreads, 0, as_stream(ctx.stream), dev(x), c, hw,
            total, mean, invstd, dev(weight), dev(bias), dev(y));
}

template <>
template <class T>
void BatchNorm<Cuda>::update_running(T* running_mean, T* running_var, const double* mean,
                                     const double* var, int64_t c, int64_t count, double momentum,
                                     Ctx ctx) {
  using D = device_t<T>;
  RG_CHECK(c >= 0 && count >= 0, "batch_norm_update_running: c and count must be non-negative");
  if (c == 0 || (!running_mean && !running_var)) return;
  const double unbias = count > 1 ? double(count) / double(count - 1) : 1.0;
  RG_LAUNCH(update_running_kernel<D>, blocks_for(c), kThreads, 0, as_stream(ctx.stream),
            dev(running_mean), dev(running_var), mean, var, c, unbias, momentum);
}

template <>
template <class T>
void BatchNorm<Cuda>::backward(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                               const double* mean, const double* invstd, const T* weight,
                               bool batch_stats, T* gx, T* gweight, T* gbias, Ctx ctx) {
  using D = device_t<T>;
  detail::check_batch_norm_sizes("batch_norm_backward", n, c, hw);
  if (c == 0) return;
  RG_LAUNCH(backward_kernel<D>, channel_grid(c), channel_threads(n * hw), 0,
            as_stream(ctx.stream), dev(gy), dev(x), n, c, hw, mean, invstd, dev(weight),
            batch_stats, dev(gx), dev(gweight), dev(gbias));
}

template <>
template <class T>
void BatchNorm<Cuda>::backward_reduce(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                                      const double* mean, const double* invstd, double* sums,
                                      Ctx ctx) {
  using D = device_t<T>;
  detail::check_batch_norm_sizes("batch_norm_backward_reduce", n, c, hw);
  if (c == 0) return;
  RG_LAUNCH(backward_reduce_kernel<D>, channel_grid(c), channel_threads(n * hw), 0,
            as_stream(ctx.stream), dev(gy), dev(x), n, c, hw, mean, invstd, sums);
}

template <>
template <class T>
void BatchNorm<Cuda>::backward_elemt(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                                     const double* mean, const double* invstd, const T* weight,
                                     const double* sums, int64_t count, T* gx, Ctx ctx) {
  using D = device_t<T>;
  detail::check_batch_norm_sizes("batch_norm_backward_elemt", n, c, hw);
  RG_CHECK(count > 0, "batch_norm_backward_elemt: count must be positive, got ", count);
  if (c == 0 || n * hw == 0) return;
  RG_LAUNCH(backward_elemt_kernel<D>, channel_grid(c), channel_threads(n * hw), 0,
            as_stream(ctx.stream), dev(gy), dev(x), n, c, hw, mean, invstd, dev(weight), sums,
            static_cast<double>(count), dev(gx));
}

template <>
void BatchNorm<Cuda>::count_batch(int64_t* num_batches_tracked, Ctx ctx) {
  RG_CHECK(num_batches_tracked != nullptr, "batch_norm_count_batch: the counter must not be null");
  RG_LAUNCH(count_batch_kernel, 1, 1, 0, as_stream(ctx.stream), num_batches_tracked);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_batch_norm_kernels() {
  using K = BatchNorm<Cuda>;
  return std::tuple{&K::stats<T>,    &K::apply<T>,           &K::update_running<T>,
                    &K::backward<T>, &K::backward_reduce<T>, &K::backward_elemt<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_batch_norm_kernels)

}  // namespace rg::kernels
