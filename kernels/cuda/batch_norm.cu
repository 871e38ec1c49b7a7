// The batch-norm kernels on CUDA (kernels/batch_norm.h). A channel's n * hw values are n runs of
// hw contiguous elements. Statistics and the backward's sums split each channel into slices of
// consecutive images (slices_for: enough blocks to fill the GPU whatever c is), one block per
// slice summing in f64 with warp shuffles then shared memory; a second kernel adds a channel's
// slice partials in slice order, so the trees depend only on the sizes: results are
// deterministic. Normalization and the input gradient are elementwise grid-stride loops in the
// compute type, from per-channel coefficients formed in f64; no loop divides per element
// (SliceWalk, ChannelWalk track the position incrementally). SyncBatchNorm's backward halves
// (backward_reduce, backward_elemt) keep one block per channel.
//
// hw == 1 ([N, C] inputs, and channels-last [N * H * W, C] ones) is a matrix of rows whose
// channels are adjacent in memory: there a block takes a tile of 32 channels (one per lane, so a
// warp reads 32 consecutive values) over a slice of rows, 8 rows at a time, and merges its 8
// row-threads per channel in a fixed order (the *_rows_partial kernels); the finish kernels are
// the same.
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>

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

// ---- Sliced statistics, normalization (+ relu) and backward --------------------------------

constexpr unsigned int kSliceThreads = 256;
constexpr int64_t kTargetBlocks = 1024;    // slices of all channels: several blocks per SM
constexpr int64_t kMinSliceValues = 8192;  // a slice's values at least, when a channel has more

constexpr int64_t kTileChannels = 32;  // hw == 1: channels per block, one per lane
constexpr int64_t kTileRows = kSliceThreads / kTileChannels;  // rows a block reads at a time

int64_t channel_tiles(int64_t c) { return (c + kTileChannels - 1) / kTileChannels; }

// Slices per channel: whole images each, at most n, each under 2^31 values. With hw == 1 a block
// reads a tile of channels, so the slices fill the GPU over tiles, not channels.
int64_t slices_for(int64_t n, int64_t c, int64_t hw) {
  if (n == 0 || c == 0) return 1;
  if (hw == 1) {
    const int64_t tiles = channel_tiles(c);
    return std::max<int64_t>(
        std::min({(kTargetBlocks + tiles - 1) / tiles,
                  std::max<int64_t>(n * std::min(c, kTileChannels) / kMinSliceValues, 1), n}),
        1);
  }
  int64_t s = std::min({(kTargetBlocks + c - 1) / c, std::max<int64_t>(n * hw / kMinSliceValues, 1),
                        n});
  while (s < n && (n + s - 1) / s * hw >= (int64_t{1} << 31)) s = std::min(2 * s, n);
  return std::max<int64_t>(s, 1);
}

// Channel ch's values in images [i0, i1), a block's threads striding over them: at(u) is the
// element index of the slice's u-th value, tracked without dividing per value.
struct SliceWalk {
  int64_t base, c_hw;
  unsigned int hw, r, p, dr, dp;
  __device__ SliceWalk(int64_t i0, int64_t ch, int64_t c, int64_t hw_)
      : base(i0 * c * hw_ + ch * hw_), c_hw(c * hw_), hw(static_cast<unsigned int>(hw_)),
        r(threadIdx.x / hw), p(threadIdx.x % hw), dr(blockDim.x / hw), dp(blockDim.x % hw) {}
  __device__ __forceinline__ int64_t at() const { return base + r * c_hw + p; }
  __device__ __forceinline__ void next() {
    r += dr;
    p += dp;
    if (p >= hw) {
      p -= hw;
      ++r;
    }
  }
};

// A grid-stride loop over the elements of [n, c, hw], tracking each index's channel.
struct ChannelWalk {
  int64_t idx, stride, c, hw, p, ch, dp, dch;
  __device__ ChannelWalk(int64_t c_, int64_t hw_)
      : idx(grid_start()), stride(grid_stride()), c(c_), hw(hw_), p(idx % hw_),
        ch(idx / hw_ % c_), dp(stride % hw_), dch(stride / hw_ % c_) {}
  __device__ __forceinline__ void next() {
    idx += stride;
    p += dp;
    ch += dch;
    if (p >= hw) {
      p -= hw;
      ++ch;
    }
    if (ch >= c) ch -= c;
  }
};

// apply's value before relu (and a residual), stored in D: the one expression the forward and
// the backward's recomputed relu mask share, so both round (and contract) it alike.
template <class D, class A>
__device__ __forceinline__ D normalized(A x, A m, A scale, A shift) {
  return store<D>((x - m) * scale + shift);
}

// Per-channel coefficients of apply: centre first (folding the mean into one shift would cancel
// when |mean| is large), scale = invstd * weight formed in f64. W: the parameters' device type.
template <class D, class W>
struct ApplyCoefficients {
  using A = compute_t<D>;
  A m, scale, shift;
  __device__ ApplyCoefficients(int64_t ch, const double* mean, const double* invstd,
                               const W* weight, const W* bias)
      : m(static_cast<A>(mean[ch])),
        scale(static_cast<A>(invstd[ch] * (weight ? static_cast<double>(load(weight[ch])) : 1.0))),
        shift(bias ? static_cast<A>(load(bias[ch])) : A(0)) {}
  // Whether the output at element `at` of x of apply(..., relu) is positive (relu_backward's test
  // on that output): read from y when given, else recomputed (an apply without a residual).
  __device__ __forceinline__ bool positive(A x, const D* y, int64_t at) const {
    return load(y ? y[at] : normalized<D>(x, m, scale, shift)) > A(0);
  }
};

// Values summed (n), their sum and M2 = sum((x - mean)^2), merged with Chan et al.'s pairwise
// update: the spread of each part is taken around its own mean, so no large mean cancels.
struct Moments {
  double n = 0, sum = 0, m2 = 0;
  __device__ __forceinline__ void merge(const Moments& o) {
    if (o.n == 0) return;
    if (n == 0) {
      *this = o;
      return;
    }
    const double total = n + o.n, delta = o.sum / o.n - sum / n;
    m2 += o.m2 + delta * delta * (n * o.n / total);
    sum += o.sum;
    n = total;
  }
  __device__ __forceinline__ Moments shuffled(int offset) const {
    return {__shfl_xor_sync(kFullMask, n, offset), __shfl_xor_sync(kFullMask, sum, offset),
            __shfl_xor_sync(kFullMask, m2, offset)};
  }
};

// A block's Moments merged with a fixed tree (warp shuffles, then one per warp), for thread 0.
// scratch: 3 x 32 doubles of shared memory.
__device__ Moments block_moments(Moments v, double (*scratch)[32]) {
  for (int offset = 16; offset > 0; offset /= 2) v.merge(v.shuffled(offset));
  const unsigned int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // a previous call's readers are done with scratch
  if (lane == 0) {
    scratch[0][warp] = v.n;
    scratch[1][warp] = v.sum;
    scratch[2][warp] = v.m2;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < blockDim.x / 32 ? Moments{scratch[0][lane], scratch[1][lane], scratch[2][lane]}
                               : Moments{};
    for (int offset = 16; offset > 0; offset /= 2) v.merge(v.shuffled(offset));
  }
  return v;
}

// Per slice: its values' sum and M2 (each thread's around its first value, in f64, then merged),
// written to partial[k * c + ch] and partial[(slices + k) * c + ch].
template <class D>
__global__ void stats_partial_kernel(const D* x, int64_t n, int64_t c, int64_t hw, int64_t slices,
                                     double* partial) {
  __shared__ double scratch[3][32];
  const int64_t ch = blockIdx.x / slices, k = blockIdx.x % slices;
  const int64_t i0 = k * n / slices, i1 = (k + 1) * n / slices;
  const unsigned int values = static_cast<unsigned int>((i1 - i0) * hw);
  SliceWalk w(i0, ch, c, hw);
  const double shift =
      threadIdx.x < values ? static_cast<double>(load(x[w.at()])) : 0.0;  // this thread's first
  double count = 0, s0 = 0, s1 = 0, s2 = 0;
  RG_UNROLL(4)
  for (unsigned int u = threadIdx.x; u < values; u += blockDim.x, w.next()) {
    const double v = static_cast<double>(load(x[w.at()]));
    const double d = v - shift;
    count += 1;
    s0 += v;
    s1 += d;
    s2 += d * d;
  }
  Moments mine;
  if (count > 0) {
    const double m2 = s2 - s1 * s1 / count;  // rounding may leave it just below 0; NaN stays NaN
    mine = {count, s0, m2 < 0 ? 0.0 : m2};
  }
  const Moments total = block_moments(mine, scratch);
  if (threadIdx.x == 0) {
    partial[k * c + ch] = total.sum;
    partial[(slices + k) * c + ch] = total.m2;
  }
}

// hw == 1: stats_partial_kernel's partials for a tile of 32 channels (blockIdx.x / slices) over
// slice k's rows; thread (row r, lane) reads rows i0 + r, i0 + r + 8, ... of channel tile * 32 +
// lane, and lane's 8 row-threads merge in row order.
template <class D>
__global__ void stats_rows_partial_kernel(const D* x, int64_t n, int64_t c, int64_t slices,
                                          double* partial) {
  __shared__ double part[3][kTileRows][kTileChannels];
  const int64_t k = blockIdx.x % slices;
  const unsigned int lane = threadIdx.x % kTileChannels, r = threadIdx.x / kTileChannels;
  const int64_t ch = blockIdx.x / slices * kTileChannels + lane;
  const int64_t i0 = k * n / slices, i1 = (k + 1) * n / slices;
  double count = 0, s0 = 0, s1 = 0, s2 = 0;
  if (ch < c && i0 + r < i1) {
    const double shift = static_cast<double>(load(x[(i0 + r) * c + ch]));  // its first value
    RG_UNROLL(4)
    for (int64_t i = i0 + r; i < i1; i += kTileRows) {
      const double v = static_cast<double>(load(x[i * c + ch]));
      const double d = v - shift;
      count += 1;
      s0 += v;
      s1 += d;
      s2 += d * d;
    }
  }
  const double m2 = count > 0 ? s2 - s1 * s1 / count : 0.0;  // NaN stays NaN
  part[0][r][lane] = count;
  part[1][r][lane] = s0;
  part[2][r][lane] = m2 < 0 ? 0.0 : m2;
  __syncthreads();
  if (r == 0 && ch < c) {
    Moments total;
    for (unsigned int j = 0; j < kTileRows; ++j)
      total.merge({part[0][j][lane], part[1][j][lane], part[2][j][lane]});
    partial[k * c + ch] = total.sum;
    partial[(slices + k) * c + ch] = total.m2;
  }
}

// Per channel: the slices' Moments merged in slice order, then mean, the biased variance and
// invstd.
__global__ void stats_finish_kernel(int64_t n, int64_t c, int64_t hw, int64_t slices,
                                    const double* partial, double* mean, double* var,
                                    double* invstd, double eps) {
  for (int64_t ch = grid_start(); ch < c; ch += grid_stride()) {
    Moments all;
    for (int64_t k = 0; k < slices; ++k) {
      const double values = static_cast<double>(((k + 1) * n / slices - k * n / slices) * hw);
      all.merge({values, partial[k * c + ch], partial[(slices + k) * c + ch]});
    }
    const double m = static_cast<double>(n * hw);  // 0: NaN statistics, as 0 / 0
    const double v = all.m2 / m;
    mean[ch] = all.sum / m;
    var[ch] = v;
    if (invstd) invstd[ch] = 1.0 / sqrt(v + eps);
  }
}

template <class D, class W>
__global__ void apply_kernel(const D* x, int64_t c, int64_t hw, int64_t total, const double* mean,
                             const double* invstd, const W* weight, const W* bias,
                             const D* residual, bool relu, D* y) {
  using A = compute_t<D>;
  ChannelWalk w(c, hw);
  int64_t cached = -1;
  A m = 0, scale = 0, shift = 0;
  RG_UNROLL(4)
  for (; w.idx < total; w.next()) {
    if (w.ch != cached) {
      const ApplyCoefficients<D, W> k(w.ch, mean, invstd, weight, bias);
      m = k.m;
      scale = k.scale;
      shift = k.shift;
      cached = w.ch;
    }
    D v = normalized<D>(load(x[w.idx]), m, scale, shift);
    if (residual) v = store<D>(load(v) + load(residual[w.idx]));  // as an unfused add sees v
    y[w.idx] = relu && load(v) < A(0) ? store<D>(A(0)) : v;
  }
}

// Per slice: sum(g) and sum(g * (x - mean)) in f64, g = gy (relu: where apply's output is
// positive, else 0), into partial as stats_partial_kernel's.
template <class D, class W>
__global__ void backward_partial_kernel(const D* gy, const D* x, int64_t n, int64_t c, int64_t hw,
                                        int64_t slices, const double* mean, const double* invstd,
                                        const W* weight, const W* bias, const D* y, bool relu,
                                        double* partial) {
  using A = compute_t<D>;
  __shared__ double scratch[32];
  const int64_t ch = blockIdx.x / slices, k = blockIdx.x % slices;
  const int64_t i0 = k * n / slices, i1 = (k + 1) * n / slices;
  const double mu = mean[ch];
  const ApplyCoefficients<D, W> coef(ch, mean, invstd, weight, bias);
  const unsigned int values = static_cast<unsigned int>((i1 - i0) * hw);
  double sum_g = 0, sum_g_xmu = 0;
  SliceWalk w(i0, ch, c, hw);
  RG_UNROLL(4)
  for (unsigned int u = threadIdx.x; u < values; u += blockDim.x, w.next()) {
    const int64_t at = w.at();
    const A xv = load(x[at]);
    const double g =
        relu && !coef.positive(xv, y, at) ? 0.0 : static_cast<double>(load(gy[at]));
    sum_g += g;
    sum_g_xmu += g * (static_cast<double>(xv) - mu);
  }
  sum_g = block_sum(sum_g, scratch);
  sum_g_xmu = block_sum(sum_g_xmu, scratch);
  if (threadIdx.x == 0) {
    partial[k * c + ch] = sum_g;
    partial[(slices + k) * c + ch] = sum_g_xmu;
  }
}

// hw == 1: backward_partial_kernel's partials for a tile of 32 channels over slice k's rows, laid
// out as stats_rows_partial_kernel's; lane's 8 row-threads add in row order.
template <class D, class W>
__global__ void backward_rows_partial_kernel(const D* gy, const D* x, int64_t n, int64_t c,
                                             int64_t slices, const double* mean,
                                             const double* invstd, const W* weight, const W* bias,
                                             const D* y, bool relu, double* partial) {
  using A = compute_t<D>;
  __shared__ double part[2][kTileRows][kTileChannels];
  const int64_t k = blockIdx.x % slices;
  const unsigned int lane = threadIdx.x % kTileChannels, r = threadIdx.x / kTileChannels;
  const int64_t ch = blockIdx.x / slices * kTileChannels + lane;
  const int64_t i0 = k * n / slices, i1 = (k + 1) * n / slices;
  double sum_g = 0, sum_g_xmu = 0;
  if (ch < c) {
    const double mu = mean[ch];
    const ApplyCoefficients<D, W> coef(ch, mean, invstd, weight, bias);
    RG_UNROLL(4)
    for (int64_t i = i0 + r; i < i1; i += kTileRows) {
      const int64_t at = i * c + ch;
      const A xv = load(x[at]);
      const double g =
          relu && !coef.positive(xv, y, at) ? 0.0 : static_cast<double>(load(gy[at]));
      sum_g += g;
      sum_g_xmu += g * (static_cast<double>(xv) - mu);
    }
  }
  part[0][r][lane] = sum_g;
  part[1][r][lane] = sum_g_xmu;
  __syncthreads();
  if (r == 0 && ch < c) {
    double a = 0, b = 0;
    for (unsigned int j = 0; j < kTileRows; ++j) {
      a += part[0][j][lane];
      b += part[1][j][lane];
    }
    partial[k * c + ch] = a;
    partial[(slices + k) * c + ch] = b;
  }
}

// Per channel: the slices' sums in slice order; gweight, gbias; and gx's coefficients
// gx = a * g + b * (x - mean) + d (as input_gradient forms them) into coef[0..3c).
template <class W>
__global__ void backward_finish_kernel(int64_t c, int64_t slices, double m, const double* partial,
                                       const double* invstd, const W* weight, bool batch_stats,
                                       W* gweight, W* gbias, double* coef) {
  for (int64_t ch = grid_start(); ch < c; ch += grid_stride()) {
    double sum_g = 0, sum_g_xmu = 0;
    for (int64_t k = 0; k < slices; ++k) {
      sum_g += partial[k * c + ch];
      sum_g_xmu += partial[(slices + k) * c + ch];
    }
    const double is = invstd[ch];
    const double sum_g_xhat = sum_g_xmu * is;
    if (gweight) gweight[ch] = store<W>(sum_g_xhat);
    if (gbias) gbias[ch] = store<W>(sum_g);
    const double w = weight ? static_cast<double>(load(weight[ch])) : 1.0;
    coef[ch] = w * is;
    coef[c + ch] = batch_stats ? -w * is * is * sum_g_xhat / m : 0.0;
    coef[2 * c + ch] = batch_stats ? -w * is * sum_g / m : 0.0;
  }
}

template <class D, class W>
__global__ void backward_input_kernel(const D* gy, const D* x, int64_t c, int64_t hw,
                                      int64_t total, const double* mean, const double* invstd,
                                      const W* weight, const W* bias, const D* y, bool relu,
                                      const double* coef, D* gx, D* gresidual) {
  using A = compute_t<D>;
  ChannelWalk w(c, hw);
  int64_t cached = -1;
  A a = 0, b = 0, d = 0, mu = 0, m = 0, scale = 0, shift = 0;
  RG_UNROLL(4)
  for (; w.idx < total; w.next()) {
    if (w.ch != cached) {
      const ApplyCoefficients<D, W> k(w.ch, mean, invstd, weight, bias);
      m = k.m;
      scale = k.scale;
      shift = k.shift;
      a = static_cast<A>(coef[w.ch]);
      b = static_cast<A>(coef[c + w.ch]);
      d = static_cast<A>(coef[2 * c + w.ch]);
      mu = static_cast<A>(mean[w.ch]);
      cached = w.ch;
    }
    const A xv = load(x[w.idx]);
    const bool keep =
        !relu || load(y ? y[w.idx] : normalized<D>(xv, m, scale, shift)) > A(0);
    const D gd = keep ? gy[w.idx] : store<D>(A(0));
    if (gx) gx[w.idx] = store<D>(a * load(gd) + b * (xv - mu) + d);
    if (gresidual) gresidual[w.idx] = gd;
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
int64_t BatchNorm<Cuda>::workspace_bytes(int64_t n, int64_t c, int64_t hw) {
  if (c <= 0) return 0;
  // stats: 2 partials per slice and channel; backward: those and 3 coefficients per channel.
  return (2 * slices_for(n, c, hw) + 3) * c * static_cast<int64_t>(sizeof(double));
}

namespace {

void check_workspace(const char* op, Workspace workspace, int64_t n, int64_t c, int64_t hw) {
  const int64_t need = BatchNorm<Cuda>::workspace_bytes(n, c, hw);
  RG_CHECK(workspace.data != nullptr && workspace.bytes >= need, op, ": needs a workspace of ",
           need, " bytes (workspace_bytes), got ", workspace.bytes);
  RG_CHECK(hw < (int64_t{1} << 31), op, ": at most 2^31 - 1 values per image and channel, got ",
           hw);
}

// One block per slice and channel, or with hw == 1 per slice and tile of 32 channels.
unsigned int slice_grid(int64_t slices, int64_t c, int64_t hw) {
  return static_cast<unsigned int>(slices * (hw == 1 ? channel_tiles(c) : c));
}

}  // namespace

template <>
template <class T>
void BatchNorm<Cuda>::stats(const T* x, int64_t n, int64_t c, int64_t hw, double* mean,
                            double* var, double* invstd, double eps, Workspace workspace,
                            Ctx ctx) {
  using D = device_t<T>;
  detail::check_batch_norm_sizes("batch_norm_stats", n, c, hw);
  RG_CHECK(eps >= 0, "batch_norm_stats: eps must be non-negative, got ", eps);
  if (c == 0) return;
  RG_CHECK(mean != nullptr && var != nullptr, "batch_norm_stats: mean and var must not be null");
  check_workspace("batch_norm_stats", workspace, n, c, hw);
  double* partial = static_cast<double*>(workspace.data);
  // No values: no slices, and the finish kernel's 0 / 0 gives NaN statistics.
  const int64_t m = n * hw;
  const int64_t slices = m == 0 ? 0 : slices_for(n, c, hw);
  if (slices > 0 && hw == 1) {
    RG_LAUNCH(stats_rows_partial_kernel<D>, slice_grid(slices, c, hw), kSliceThreads, 0,
              as_stream(ctx.stream), dev(x), n, c, slices, partial);
  } else if (slices > 0) {
    RG_LAUNCH(stats_partial_kernel<D>, slice_grid(slices, c, hw), kSliceThreads, 0,
              as_stream(ctx.stream), dev(x), n, c, hw, slices, partial);
  }
  RG_LAUNCH(stats_finish_kernel, blocks_for(c), kThreads, 0, as_stream(ctx.stream), n, c, hw,
            slices, partial, mean, var, invstd, eps);
}

template <>
template <class T, class P>
void BatchNorm<Cuda>::apply(const T* x, int64_t n, int64_t c, int64_t hw, const double* mean,
                            const double* invstd, const std::type_identity_t<P>* weight,
                            const std::type_identity_t<P>* bias, const T* residual, bool relu,
                            T* y, Ctx ctx) {
  using D = device_t<T>;
  using W = device_t<P>;
  detail::check_batch_norm_sizes("batch_norm_apply", n, c, hw);
  const int64_t total = n * c * hw;
  if (total == 0) return;
  RG_LAUNCH((apply_kernel<D, W>), blocks_for(total), kThreads, 0, as_stream(ctx.stream), dev(x),
            c, hw, total, mean, invstd, dev(weight), dev(bias), dev(residual), relu, dev(y));
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
template <class T, class P>
void BatchNorm<Cuda>::backward(const T* gy, const T* x, int64_t n, int64_t c, int64_t hw,
                               const double* mean, const double* invstd,
                               const std::type_identity_t<P>* weight,
                               const std::type_identity_t<P>* bias, const T* y, bool batch_stats,
                               bool relu, T* gx, std::type_identity_t<P>* gweight,
                               std::type_identity_t<P>* gbias, T* gresidual, Workspace workspace,
                               Ctx ctx) {
  using D = device_t<T>;
  using W = device_t<P>;
  detail::check_batch_norm_sizes("batch_norm_backward", n, c, hw);
  if (c == 0) return;
  check_workspace("batch_norm_backward", workspace, n, c, hw);
  const int64_t m = n * hw;
  const int64_t slices = m == 0 ? 0 : slices_for(n, c, hw);
  double* partial = static_cast<double*>(workspace.data);
  double* coef = partial + 2 * slices_for(n, c, hw) * c;
  if (slices > 0 && hw == 1) {
    RG_LAUNCH((backward_rows_partial_kernel<D, W>), slice_grid(slices, c, hw), kSliceThreads, 0,
              as_stream(ctx.stream), dev(gy), dev(x), n, c, slices, mean, invstd, dev(weight),
              dev(bias), dev(y), relu, partial);
  } else if (slices > 0) {
    RG_LAUNCH((backward_partial_kernel<D, W>), slice_grid(slices, c, hw), kSliceThreads, 0,
              as_stream(ctx.stream), dev(gy), dev(x), n, c, hw, slices, mean, invstd, dev(weight),
              dev(bias), dev(y), relu, partial);
  }
  RG_LAUNCH(backward_finish_kernel<W>, blocks_for(c), kThreads, 0, as_stream(ctx.stream), c,
            slices, static_cast<double>(m), partial, invstd, dev(weight), batch_stats,
            dev(gweight), dev(gbias), coef);
  if ((!gx && !gresidual) || m == 0) return;
  RG_LAUNCH((backward_input_kernel<D, W>), blocks_for(n * c * hw), kThreads, 0,
            as_stream(ctx.stream), dev(gy), dev(x), c, hw, n * c * hw, mean, invstd, dev(weight),
            dev(bias), dev(y), relu, coef, dev(gx), dev(gresidual));
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

// f16/bf16 activations with f32 parameters (autocast's BatchNorm2d).
template <class T>
auto cuda_batch_norm_mixed_kernels() {
  using K = BatchNorm<Cuda>;
  return std::tuple{&K::apply<T, float>, &K::backward<T, float>};
}
RG_INSTANTIATE(RG_CUDA_HALF_TYPES, cuda_batch_norm_mixed_kernels)

}  // namespace rg::kernels
