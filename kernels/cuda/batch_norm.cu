// Batch-norm kernels. Statistics and the backward take one block per channel: a channel's n * hw
// values are n runs of hw contiguous elements, summed with warp shuffles then shared memory;
// normalization is elementwise.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/batch_norm.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::kernels::cuda {
namespace {

using detail::as_stream;
using detail::block_sum;
using detail::blocks_for;
using detail::dev;
using detail::device_t;
using detail::grid_start;
using detail::grid_stride;
using detail::kFullMask;
using detail::kThreads;
using detail::load;
using detail::store;
using detail::warp_sum;

constexpr unsigned int kChannelThreads = 512;  // at most, per channel block
constexpr int64_t kMaxGrid = 65535;            // channel loops cover the rest

// Element j of channel ch's m = n * hw values.
__device__ __forceinline__ int64_t channel_index(int64_t j, int64_t ch, int64_t c, int64_t hw) {
  return (j / hw * c + ch) * hw + j % hw;
}

template <class D>
__global__ void stats_kernel(const D* x, int64_t n, int64_t c, int64_t hw, float* mean, float* var,
                             float* invstd, float eps) {
  __shared__ float scratch[32];
  const int64_t m = n * hw;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    float sum = 0;
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x)
      sum += load(x[channel_index(j, ch, c, hw)]);
    const float mu = block_sum(sum, scratch) / static_cast<float>(m);
    // Second pass around the mean: no cancellation from E[x^2] - E[x]^2.
    float sq = 0;
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
      const float d = load(x[channel_index(j, ch, c, hw)]) - mu;
      sq += d * d;
    }
    const float v = block_sum(sq, scratch) / static_cast<float>(m);
    if (threadIdx.x == 0) {
      mean[ch] = mu;
      var[ch] = v;
      if (invstd) invstd[ch] = 1.f / sqrtf(v + eps);
    }
  }
}

template <class D>
__global__ void apply_kernel(const D* x, int64_t c, int64_t hw, int64_t total, const float* mean,
                             const float* invstd, const D* weight, const D* bias, D* y) {
  for (int64_t idx = grid_start(); idx < total; idx += grid_stride()) {
    const int64_t ch = idx / hw % c;
    // Centre first: folding the mean into one shift would cancel when |mean| is large.
    const float scale = invstd[ch] * (weight ? load(weight[ch]) : 1.f);
    const float shift = bias ? load(bias[ch]) : 0.f;
    y[idx] = store<D>((load(x[idx]) - mean[ch]) * scale + shift);
  }
}

template <class D>
__global__ void update_running_kernel(D* running_mean, D* running_var, const float* mean,
                                      const float* var, int64_t c, float unbias, float momentum) {
  for (int64_t ch = grid_start(); ch < c; ch += grid_stride()) {
    if (running_mean) {
      running_mean[ch] = store<D>((1.f - momentum) * load(running_mean[ch]) + momentum * mean[ch]);
    }
    if (running_var) {
      running_var[ch] =
          store<D>((1.f - momentum) * load(running_var[ch]) + momentum * var[ch] * unbias);
    }
  }
}

template <class D>
__global__ void backward_kernel(const D* gy, const D* x, int64_t n, int64_t c, int64_t hw,
                                const float* mean, const float* invstd, const D* weight,
                                bool batch_stats, D* gx, D* gweight, D* gbias) {
  __shared__ float scratch[32];
  const int64_t m = n * hw;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    const float mu = mean[ch], is = invstd[ch];
    // sum(gy) and sum(gy * (x - mean)); xhat = (x - mean) * invstd.
    float sum_gy = 0, sum_gy_xmu = 0;
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
      const int64_t at = channel_index(j, ch, c, hw);
      const float g = load(gy[at]);
      sum_gy += g;
      sum_gy_xmu += g * (load(x[at]) - mu);
    }
    sum_gy = block_sum(sum_gy, scratch);
    sum_gy_xmu = block_sum(sum_gy_xmu, scratch);
    const float sum_gy_xhat = sum_gy_xmu * is;
    if (threadIdx.x == 0) {
      if (gweight) gweight[ch] = store<D>(sum_gy_xhat);
      if (gbias) gbias[ch] = store<D>(sum_gy);
    }
    if (gx) {
      const float w = weight ? load(weight[ch]) : 1.f;
      // gx = a * gy + b * (x - mean) + d: the training-mode terms fold into b and d.
      const float a = w * is;
      const float b = batch_stats ? -w * is * is * sum_gy_xhat / static_cast<float>(m) : 0.f;
      const float d = batch_stats ? -w * is * sum_gy / static_cast<float>(m) : 0.f;
      for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
        const int64_t at = channel_index(j, ch, c, hw);
        gx[at] = store<D>(a * load(gy[at]) + b * (load(x[at]) - mu) + d);
      }
    }
  }
}

void check_sizes(const char* op, int64_t n, int64_t c, int64_t hw) {
  RG_CHECK(n >= 0 && c >= 0 && hw >= 0, op, ": sizes must be non-negative, got n ", n, ", c ", c,
           ", hw ", hw);
}

unsigned int channel_threads(int64_t m) {
  return static_cast<unsigned int>(std::clamp<int64_t>((m + 31) / 32 * 32, 32, kChannelThreads));
}

unsigned int channel_grid(int64_t c) { return static_cast<unsigned int>(std::min(c, kMaxGrid)); }

}  // namespace

template <class T>
void batch_norm_stats(const T* x, int64_t n, int64_t c, int64_t hw, float* mean, float* var,
                      float* invstd, double eps, void* stream) {
  using D = device_t<T>;
  check_sizes("batch_norm_stats", n, c, hw);
  RG_CHECK(eps >= 0, "batch_norm_stats: eps must be non-negative, got ", eps);
  if (c == 0) return;
  RG_CHECK(mean != nullptr && var != nullptr, "batch_norm_stats: mean and var must not be null");
  RG_LAUNCH(stats_kernel<D>, channel_grid(c), channel_threads(n * hw), 0, as_stream(stream), dev(x),
            n, c, hw, mean, var, invstd, static_cast<float>(eps));
}

template <class T>
void batch_norm_apply(const T* x, int64_t n, int64_t c, int64_t hw, const float* mean,
                      const float* invstd, const T* weight, const T* bias, T* y, void* stream) {
  using D = device_t<T>;
  check_sizes("batch_norm_apply", n, c, hw);
  const int64_t total = n * c * hw;
  if (total == 0) return;
  RG_LAUNCH(apply_kernel<D>, blocks_for(total), kThreads, 0, as_stream(stream), dev(x), c, hw,
            total, mean, invstd, dev(weight), dev(bias), dev(y));
}

template <class T>
void batch_norm_update_running(T* running_mean, T* running_var, const float* mean, const float* var,
                               int64_t c, int64_t count, double momentum, void* stream) {
  using D = device_t<T>;
  RG_CHECK(c >= 0 && count >= 0, "batch_norm_update_running: c and count must be non-negative");
  if (c == 0 || (!running_mean && !running_var)) return;
  const double unbias = count > 1 ? double(count) / double(count - 1) : 1.0;
  RG_LAUNCH(update_running_kernel<D>, blocks_for(c), kThreads, 0, as_stream(stream),
            dev(running_mean), dev(running_var), mean, var, c, static_cast<float>(unbias),
            static_cast<float>(momentum));
}

template <class T>
void batch_norm_backward(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                         const float* mean, const float* invstd, const T* weight, bool batch_stats,
                         T* gx, T* gweight, T* gbias, void* stream) {
  using D = device_t<T>;
  check_sizes("batch_norm_backward", n, c, hw);
  if (c == 0) return;
  RG_LAUNCH(backward_kernel<D>, channel_grid(c), channel_threads(n * hw), 0, as_stream(stream),
            dev(gy), dev(x), n, c, hw, mean, invstd, dev(weight), batch_stats, dev(gx),
            dev(gweight), dev(gbias));
}

#define RG_INSTANTIATE_BATCH_NORM(T)                                                               \
  template void batch_norm_stats<T>(const T*, int64_t, int64_t, int64_t, float*, float*, float*,   \
                                    double, void*);                                                \
  template void batch_norm_apply<T>(const T*, int64_t, int64_t, int64_t, const float*,             \
                                    const float*, const T*, const T*, T*, void*);                  \
  template void batch_norm_update_running<T>(T*, T*, const float*, const float*, int64_t, int64_t, \
                                             double, void*);                                       \
  template void batch_norm_backward<T>(const T*, const T*, int64_t, int64_t, int64_t,              \
                                       const float*, const float*, const T*, bool, T*, T*, T*,     \
                                       void*);
RG_INSTANTIATE_BATCH_NORM(float)
RG_INSTANTIATE_BATCH_NORM(Half)
RG_INSTANTIATE_BATCH_NORM(BFloat16)
#undef RG_INSTANTIATE_BATCH_NORM

}  // namespace rg::kernels::cuda
