// The pooling kernels on CUDA (kernels/pool.h): one thread per output pixel forward, one thread
// per input pixel backward (a gather over the windows that contain it, in the CPU's scatter order,
// so no atomics); global average pooling takes one block per plane (f64 warp shuffles, then shared
// memory). The 2-D kernels serve both layouts (a template flag); in channels last, consecutive
// threads take consecutive channels of one pixel, so a warp's loads are contiguous. Channels-last
// global average pooling takes one thread per mean, its hw loads in order (a warp: consecutive
// channels).
#include <math.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"
#include "kernels/half.h"
#include "kernels/pool.h"

namespace rg::kernels {
namespace {

using cuda::detail::as_stream;
using cuda::detail::block_sum;
using cuda::detail::blocks_for;
using cuda::detail::compute_t;
using cuda::detail::dev;
using cuda::detail::device_t;
using cuda::detail::grid_start;
using cuda::detail::grid_stride;
using cuda::detail::kThreads;
using cuda::detail::load;
using cuda::detail::store;

constexpr unsigned int kPlaneThreads = 256;  // at most, per plane block
constexpr int64_t kMaxGrid = 65535;          // plane loops cover the rest

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a < b ? b : a; }

// Window of output pixel (oh, ow), as kernels/cpu/pool.cpp: [h0, h1) x [w0, w1) clipped to the
// input, and its size clipped to the padded input (the count_include_pad divisor).
struct Window {
  int64_t h0, h1, w0, w1;
  int64_t padded_size;
};

__device__ __forceinline__ Window window(const Pool2dGeometry& g, int64_t oh, int64_t ow) {
  const int64_t hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
  const int64_t he = min64(hs + g.kh, g.h + g.ph), we = min64(ws + g.kw, g.w + g.pw);
  return {max64(hs, 0), min64(he, g.h), max64(ws, 0), min64(we, g.w), (he - hs) * (we - ws)};
}

__device__ __forceinline__ int64_t divisor(const Window& win, bool count_include_pad) {
  return count_include_pad ? win.padded_size : (win.h1 - win.h0) * (win.w1 - win.w0);
}

// Element idx of an x-shaped or y-shaped array of `pixels` pixels per plane: its pixel inside its
// plane, and where that plane starts in an array of any plane size and how far apart its pixels
// are. NCHW planes are contiguous; channels last interleaves the c planes of an image.
struct Site {
  int64_t pixel;
  int64_t group, lane, stride;  // the plane (NCHW) or image, the channel (0 in NCHW), 1 or c

  __device__ __forceinline__ int64_t base(int64_t plane_pixels) const {
    return group * plane_pixels * stride + lane;
  }
};

template <bool kChannelsLast>
__device__ __forceinline__ Site site(int64_t idx, int64_t pixels, int64_t c) {
  if constexpr (kChannelsLast) {
    const int64_t pix = idx / c;
    return {pix % pixels, pix / pixels, idx % c, c};
  } else {
    return {idx % pixels, idx / pixels, 0, 1};
  }
}

// The outputs [lo, hi] along one axis whose windows contain input coordinate i.
struct Range {
  int64_t lo, hi;
};
__device__ __forceinline__ Range outputs_over(int64_t i, int64_t k, int64_t s, int64_t p,
                                              int64_t out) {
  const int64_t lo = i + p < k ? 0 : (i + p - k) / s + 1;
  return {lo, min64((i + p) / s, out - 1)};
}

template <class D, bool kChannelsLast>
__global__ void max_pool2d_forward_kernel(Pool2dGeometry g, const D* x, D* y, int64_t* argmax) {
  using A = compute_t<D>;
  for (int64_t idx = grid_start(); idx < g.planes * g.ho * g.wo; idx += grid_stride()) {
    const Site s = site<kChannelsLast>(idx, g.ho * g.wo, g.c);
    const int64_t oh = s.pixel / g.wo, ow = s.pixel % g.wo;
    const D* in = x + s.base(g.h * g.w);
    const Window win = window(g, oh, ow);
    // The first maximum; a NaN wins and ends the search (PyTorch propagates NaN).
    int64_t best_i = win.h0 * g.w + win.w0;
    A best = -INFINITY;
    bool found_nan = false;
    for (int64_t ih = win.h0; ih < win.h1 && !found_nan; ++ih) {
      for (int64_t iw = win.w0; iw < win.w1; ++iw) {
        const A v = load(in[(ih * g.w + iw) * s.stride]);
        if (v != v) {
          best_i = ih * g.w + iw;
          found_nan = true;
          break;
        }
        if (v > best) {
          best = v;
          best_i = ih * g.w + iw;
        }
      }
    }
    y[idx] = in[best_i * s.stride];
    argmax[idx] = best_i;
  }
}

template <class D, bool kChannelsLast>
__global__ void max_pool2d_backward_kernel(Pool2dGeometry g, const D* gy, const int64_t* argmax,
                                           D* gx) {
  using A = compute_t<D>;
  for (int64_t idx = grid_start(); idx < g.planes * g.h * g.w; idx += grid_stride()) {
    const Site s = site<kChannelsLast>(idx, g.h * g.w, g.c);
    const int64_t j = s.pixel, ih = j / g.w, iw = j % g.w;
    const Range rh = outputs_over(ih, g.kh, g.sh, g.ph, g.ho);
    const Range rw = outputs_over(iw, g.kw, g.sw, g.pw, g.wo);
    const D* grad = gy + s.base(g.ho * g.wo);
    const int64_t* am = argmax + s.base(g.ho * g.wo);
    A acc = 0;
    for (int64_t oh = rh.lo; oh <= rh.hi; ++oh) {
      for (int64_t ow = rw.lo; ow <= rw.hi; ++ow) {
        const int64_t o = (oh * g.wo + ow) * s.stride;
        if (am[o] == j) acc += load(grad[o]);
      }
    }
    gx[idx] = store<D>(acc);
  }
}

template <class D, bool kChannelsLast>
__global__ void avg_pool2d_forward_kernel(Pool2dGeometry g, const D* x, D* y,
                                          bool count_include_pad) {
  using A = compute_t<D>;
  for (int64_t idx = grid_start(); idx < g.planes * g.ho * g.wo; idx += grid_stride()) {
    const Site s = site<kChannelsLast>(idx, g.ho * g.wo, g.c);
    const int64_t oh = s.pixel / g.wo, ow = s.pixel % g.wo;
    const D* in = x + s.base(g.h * g.w);
    const Window win = window(g, oh, ow);
    A acc = 0;
    for (int64_t ih = win.h0; ih < win.h1; ++ih) {
      for (int64_t iw = win.w0; iw < win.w1; ++iw) acc += load(in[(ih * g.w + iw) * s.stride]);
    }
    y[idx] = store<D>(acc / static_cast<A>(divisor(win, count_include_pad)));
  }
}

template <class D, bool kChannelsLast>
__global__ void avg_pool2d_backward_kernel(Pool2dGeometry g, const D* gy, D* gx,
                                           bool count_include_pad) {
  using A = compute_t<D>;
  for (int64_t idx = grid_start(); idx < g.planes * g.h * g.w; idx += grid_stride()) {
    const Site s = site<kChannelsLast>(idx, g.h * g.w, g.c);
    const int64_t ih = s.pixel / g.w, iw = s.pixel % g.w;
    const Range rh = outputs_over(ih, g.kh, g.sh, g.ph, g.ho);
    const Range rw = outputs_over(iw, g.kw, g.sw, g.pw, g.wo);
    const D* grad = gy + s.base(g.ho * g.wo);
    A acc = 0;
    for (int64_t oh = rh.lo; oh <= rh.hi; ++oh) {
      for (int64_t ow = rw.lo; ow <= rw.hi; ++ow) {
        const A div = static_cast<A>(divisor(window(g, oh, ow), count_include_pad));
        acc += load(grad[(oh * g.wo + ow) * s.stride]) / div;
      }
    }
    gx[idx] = store<D>(acc);
  }
}

// One block per plane, summing in f64.
template <class D>
__global__ void global_avg_pool_kernel(const D* x, D* y, int64_t planes, int64_t hw) {
  __shared__ double scratch[32];
  for (int64_t p = blockIdx.x; p < planes; p += gridDim.x) {
    const D* in = x + p * hw;
    double acc = 0;
    for (int64_t i = threadIdx.x; i < hw; i += blockDim.x) acc += static_cast<double>(load(in[i]));
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) y[p] = store<D>(acc / static_cast<double>(hw));
  }
}

template <class D>
__global__ void global_avg_pool_backward_kernel(const D* gy, D* gx, int64_t planes, int64_t hw) {
  using A = compute_t<D>;
  for (int64_t idx = grid_start(); idx < planes * hw; idx += grid_stride()) {
    gx[idx] = store<D>(load(gy[idx / hw]) / static_cast<A>(hw));
  }
}

// One thread per mean: x is [n, hw, c], y [n, c]. The hw values are added in order, so the bits
// are the CPU's; the loads go in batches of kBatch ahead of their adds, so a thread has several
// in flight (a few thousand threads may each loop over a thousand pixels).
template <class D>
__global__ void global_avg_pool_channels_last_kernel(const D* x, D* y, int64_t n, int64_t c,
                                                     int64_t hw) {
  constexpr int kBatch = 8;
  for (int64_t idx = grid_start(); idx < n * c; idx += grid_stride()) {
    const D* in = x + idx / c * hw * c + idx % c;
    double acc = 0;
    int64_t i = 0;
    for (; i + kBatch <= hw; i += kBatch) {
      double v[kBatch];
      RG_UNROLL(8)
      for (int k = 0; k < kBatch; ++k) v[k] = static_cast<double>(load(in[(i + k) * c]));
      RG_UNROLL(8)
      for (int k = 0; k < kBatch; ++k) acc += v[k];
    }
    for (; i < hw; ++i) acc += static_cast<double>(load(in[i * c]));
    y[idx] = store<D>(acc / static_cast<double>(hw));
  }
}

template <class D>
__global__ void global_avg_pool_channels_last_backward_kernel(const D* gy, D* gx, int64_t n,
                                                              int64_t c, int64_t hw) {
  using A = compute_t<D>;
  for (int64_t idx = grid_start(); idx < n * hw * c; idx += grid_stride()) {
    gx[idx] = store<D>(load(gy[idx / (hw * c) * c + idx % c]) / static_cast<A>(hw));
  }
}

}  // namespace

template <>
template <class T>
void Pool<Cuda>::max_pool2d(const Pool2dGeometry& g, const T* x, T* y, int64_t* argmax, Ctx ctx) {
  using D = device_t<T>;
  if (!detail::check_pool2d_geometry("max_pool2d", g)) return;
  const auto max_pool2d_forward =
      g.channels_last ? &max_pool2d_forward_kernel<D, true> : &max_pool2d_forward_kernel<D, false>;
  RG_LAUNCH(max_pool2d_forward, blocks_for(g.planes * g.ho * g.wo), kThreads, 0,
            as_stream(ctx.stream), g, dev(x), dev(y), argmax);
}

template <>
template <class T>
void Pool<Cuda>::max_pool2d_backward(const Pool2dGeometry& g, const T* gy, const int64_t* argmax,
                                     T* gx, Ctx ctx) {
  using D = device_t<T>;
  if (!detail::check_pool2d_geometry("max_pool2d_backward", g)) return;
  const auto max_pool2d_backward = g.channels_last ? &max_pool2d_backward_kernel<D, true>
                                                   : &max_pool2d_backward_kernel<D, false>;
  RG_LAUNCH(max_pool2d_backward, blocks_for(g.planes * g.h * g.w), kThreads, 0,
            as_stream(ctx.stream), g, dev(gy), argmax, dev(gx));
}

template <>
template <class T>
void Pool<Cuda>::avg_pool2d(const Pool2dGeometry& g, const T* x, T* y, bool count_include_pad,
                            Ctx ctx) {
  using D = device_t<T>;
  if (!detail::check_pool2d_geometry("avg_pool2d", g)) return;
  const auto avg_pool2d_forward =
      g.channels_last ? &avg_pool2d_forward_kernel<D, true> : &avg_pool2d_forward_kernel<D, false>;
  RG_LAUNCH(avg_pool2d_forward, blocks_for(g.planes * g.ho * g.wo), kThreads, 0,
            as_stream(ctx.stream), g, dev(x), dev(y), count_include_pad);
}

template <>
template <class T>
void Pool<Cuda>::avg_pool2d_backward(const Pool2dGeometry& g, const T* gy, T* gx,
                                     bool count_include_pad, Ctx ctx) {
  using D = device_t<T>;
  if (!detail::check_pool2d_geometry("avg_pool2d_backward", g)) return;
  const auto avg_pool2d_backward = g.channels_last ? &avg_pool2d_backward_kernel<D, true>
                                                   : &avg_pool2d_backward_kernel<D, false>;
  RG_LAUNCH(avg_pool2d_backward, blocks_for(g.planes * g.h * g.w), kThreads, 0,
            as_stream(ctx.stream), g, dev(gy), dev(gx), count_include_pad);
}

template <>
template <class T>
void Pool<Cuda>::adaptive_avg_pool2d_1x1(const T* x, T* y, int64_t planes, int64_t hw, Ctx ctx) {
  using D = device_t<T>;
  if (!detail::check_global_pool_sizes("adaptive_avg_pool2d_1x1", planes, hw)) return;
  const auto threads =
      static_cast<unsigned int>(std::clamp<int64_t>((hw + 31) / 32 * 32, 32, kPlaneThreads));
  RG_LAUNCH(global_avg_pool_kernel<D>, static_cast<unsigned int>(std::min(planes, kMaxGrid)),
            threads, 0, as_stream(ctx.stream), dev(x), dev(y), planes, hw);
}

template <>
template <class T>
void Pool<Cuda>::adaptive_avg_pool2d_1x1_backward(const T* gy, T* gx, int64_t planes, int64_t hw,
                                                  Ctx ctx) {
  using D = device_t<T>;
  if (!detail::check_global_pool_sizes("adaptive_avg_pool2d_1x1_backward", planes, hw)) return;
  RG_LAUNCH(global_avg_pool_backward_kernel<D>, blocks_for(planes * hw), kThreads, 0,
            as_stream(ctx.stream), dev(gy), dev(gx), planes, hw);
}

template <>
template <class T>
void Pool<Cuda>::adaptive_avg_pool2d_1x1_channels_last(const T* x, T* y, int64_t n, int64_t c,
                                                       int64_t hw, Ctx ctx) {
  using D = device_t<T>;
  if (!detail::check_global_pool_sizes("adaptive_avg_pool2d_1x1_channels_last", n, c, hw)) return;
  RG_LAUNCH(global_avg_pool_channels_last_kernel<D>, blocks_for(n * c), kThreads, 0,
            as_stream(ctx.stream), dev(x), dev(y), n, c, hw);
}

template <>
template <class T>
void Pool<Cuda>::adaptive_avg_pool2d_1x1_channels_last_backward(const T* gy, T* gx, int64_t n,
                                                                int64_t c, int64_t hw, Ctx ctx) {
  using D = device_t<T>;
  if (!detail::check_global_pool_sizes("adaptive_avg_pool2d_1x1_channels_last_backward", n, c, hw))
    return;
  RG_LAUNCH(global_avg_pool_channels_last_backward_kernel<D>, blocks_for(n * hw * c), kThreads, 0,
            as_stream(ctx.stream), dev(gy), dev(gx), n, c, hw);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_pool_kernels() {
  using K = Pool<Cuda>;
  return std::tuple{&K::max_pool2d<T>,
                    &K::max_pool2d_backward<T>,
                    &K::avg_pool2d<T>,
                    &K::avg_pool2d_backward<T>,
                    &K::adaptive_avg_pool2d_1x1<T>,
                    &K::adaptive_avg_pool2d_1x1_backward<T>,
                    &K::adaptive_avg_pool2d_1x1_channels_last<T>,
                    &K::adaptive_avg_pool2d_1x1_channels_last_backward<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_pool_kernels)

}  // namespace rg::kernels
