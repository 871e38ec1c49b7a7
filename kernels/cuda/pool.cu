// Pooling kernels: one thread per output pixel forward, one thread per input pixel backward (a
// gather over the windows that contain it, in the CPU's scatter order, so no atomics); global
// average pooling takes one block per plane (warp shuffles, then shared memory).
#include <math.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/cuda/pool.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::kernels::cuda {
namespace {

using detail::as_stream;
using detail::block_sum;
using detail::blocks_for;
using detail::compute_t;
using detail::dev;
using detail::device_t;
using detail::grid_start;
using detail::grid_stride;
using detail::kFullMask;
using detail::kThreads;
using detail::load;
using detail::store;
using detail::warp_sum;

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

// The outputs [lo, hi] along one axis whose windows contain input coordinate i.
struct Range {
  int64_t lo, hi;
};
__device__ __forceinline__ Range outputs_over(int64_t i, int64_t k, int64_t s, int64_t p,
                                              int64_t out) {
  const int64_t lo = i + p < k ? 0 : (i + p - k) / s + 1;
  return {lo, min64((i + p) / s, out - 1)};
}

template <class D>
__global__ void max_pool2d_forward_kernel(Pool2dGeometry g, const D* x, D* y, int64_t* argmax) {
  using A = compute_t<D>;
  const int64_t per_plane = g.ho * g.wo;
  for (int64_t idx = grid_start(); idx < g.planes * per_plane; idx += grid_stride()) {
    const int64_t p = idx / per_plane, oh = idx % per_plane / g.wo, ow = idx % g.wo;
    const D* in = x + p * g.h * g.w;
    const Window win = window(g, oh, ow);
    // The first maximum; a NaN wins and ends the search (PyTorch propagates NaN).
    int64_t best_i = win.h0 * g.w + win.w0;
    A best = -INFINITY;
    bool found_nan = false;
    for (int64_t ih = win.h0; ih < win.h1 && !found_nan; ++ih) {
      for (int64_t iw = win.w0; iw < win.w1; ++iw) {
        const A v = load(in[ih * g.w + iw]);
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
    y[idx] = in[best_i];
    argmax[idx] = best_i;
  }
}

template <class D>
__global__ void max_pool2d_backward_kernel(Pool2dGeometry g, const D* gy, const int64_t* argmax,
                                           D* gx) {
  using A = compute_t<D>;
  const int64_t per_plane = g.h * g.w;
  for (int64_t idx = grid_start(); idx < g.planes * per_plane; idx += grid_stride()) {
    const int64_t p = idx / per_plane, j = idx % per_plane, ih = j / g.w, iw = j % g.w;
    const Range rh = outputs_over(ih, g.kh, g.sh, g.ph, g.ho);
    const Range rw = outputs_over(iw, g.kw, g.sw, g.pw, g.wo);
    const D* grad = gy + p * g.ho * g.wo;
    const int64_t* am = argmax + p * g.ho * g.wo;
    A acc = 0;
    for (int64_t oh = rh.lo; oh <= rh.hi; ++oh) {
      for (int64_t ow = rw.lo; ow <= rw.hi; ++ow) {
        if (am[oh * g.wo + ow] == j) acc += load(grad[oh * g.wo + ow]);
      }
    }
    gx[idx] = store<D>(acc);
  }
}

template <class D>
__global__ void avg_pool2d_forward_kernel(Pool2dGeometry g, const D* x, D* y,
                                          bool count_include_pad) {
  using A = compute_t<D>;
  const int64_t per_plane = g.ho * g.wo;
  for (int64_t idx = grid_start(); idx < g.planes * per_plane; idx += grid_stride()) {
    const int64_t p = idx / per_plane, oh = idx % per_plane / g.wo, ow = idx % g.wo;
    const D* in = x + p * g.h * g.w;
    const Window win = window(g, oh, ow);
    A acc = 0;
    for (int64_t ih = win.h0; ih < win.h1; ++ih) {
      for (int64_t iw = win.w0; iw < win.w1; ++iw) acc += load(in[ih * g.w + iw]);
    }
    y[idx] = store<D>(acc / static_cast<A>(divisor(win, count_include_pad)));
  }
}

template <class D>
__global__ void avg_pool2d_backward_kernel(Pool2dGeometry g, const D* gy, D* gx,
                                           bool count_include_pad) {
  using A = compute_t<D>;
  const int64_t per_plane = g.h * g.w;
  for (int64_t idx = grid_start(); idx < g.planes * per_plane; idx += grid_stride()) {
    const int64_t p = idx / per_plane, ih = idx % per_plane / g.w, iw = idx % g.w;
    const Range rh = outputs_over(ih, g.kh, g.sh, g.ph, g.ho);
    const Range rw = outputs_over(iw, g.kw, g.sw, g.pw, g.wo);
    const D* grad = gy + p * g.ho * g.wo;
    A acc = 0;
    for (int64_t oh = rh.lo; oh <= rh.hi; ++oh) {
      for (int64_t ow = rw.lo; ow <= rw.hi; ++ow) {
        const A div = static_cast<A>(divisor(window(g, oh, ow), count_include_pad));
        acc += load(grad[oh * g.wo + ow]) / div;
      }
    }
    gx[idx] = store<D>(acc);
  }
}

// One block per plane.
template <class D>
__global__ void global_avg_pool_kernel(const D* x, D* y, int64_t planes, int64_t hw) {
  using A = compute_t<D>;
  __shared__ A scratch[32];
  for (int64_t p = blockIdx.x; p < planes; p += gridDim.x) {
    const D* in = x + p * hw;
    A acc = 0;
    for (int64_t i = threadIdx.x; i < hw; i += blockDim.x) acc += load(in[i]);
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) y[p] = store<D>(acc / static_cast<A>(hw));
  }
}

template <class D>
__global__ void global_avg_pool_backward_kernel(const D* gy, D* gx, int64_t planes, int64_t hw) {
  using A = compute_t<D>;
  for (int64_t idx = grid_start(); idx < planes * hw; idx += grid_stride()) {
    gx[idx] = store<D>(load(gy[idx / hw]) / static_cast<A>(hw));
  }
}

// Whether there is any output; throws for an inconsistent geometry (whose windows could leave the
// padded input).
bool check_geometry(const char* op, const Pool2dGeometry& g) {
  RG_CHECK(g.planes >= 0 && g.h >= 0 && g.w >= 0, op, ": sizes must be non-negative");
  RG_CHECK(g.kh > 0 && g.kw > 0 && g.sh > 0 && g.sw > 0, op, ": kernel (", g.kh, ", ", g.kw,
           ") and stride (", g.sh, ", ", g.sw, ") must be positive");
  RG_CHECK(g.ph >= 0 && g.pw >= 0 && 2 * g.ph <= g.kh && 2 * g.pw <= g.kw, op, ": padding (", g.ph,
           ", ", g.pw, ") must be between 0 and half the kernel");
  if (g.planes == 0) return false;
  RG_CHECK(g.h > 0 && g.w > 0 && g.h + 2 * g.ph >= g.kh && g.w + 2 * g.pw >= g.kw, op, ": input ",
           g.h, "x", g.w, " with padding (", g.ph, ", ", g.pw, ") is smaller than the kernel (",
           g.kh, ", ", g.kw, ")");
  RG_CHECK(g.ho == (g.h + 2 * g.ph - g.kh) / g.sh + 1 && g.wo == (g.w + 2 * g.pw - g.kw) / g.sw + 1,
           op, ": output ", g.ho, "x", g.wo, " does not match input ", g.h, "x", g.w,
           " (floor mode)");
  return true;
}

}  // namespace

template <class T>
void max_pool2d_forward(const Pool2dGeometry& g, const T* x, T* y, int64_t* argmax, void* stream) {
  using D = device_t<T>;
  if (!check_geometry("max_pool2d_forward", g)) return;
  RG_LAUNCH(max_pool2d_forward_kernel<D>, blocks_for(g.planes * g.ho * g.wo), kThreads, 0,
            as_stream(stream), g, dev(x), dev(y), argmax);
}

template <class T>
void max_pool2d_backward(const Pool2dGeometry& g, const T* gy, const int64_t* argmax, T* gx,
                         void* stream) {
  using D = device_t<T>;
  if (!check_geometry("max_pool2d_backward", g)) return;
  RG_LAUNCH(max_pool2d_backward_kernel<D>, blocks_for(g.planes * g.h * g.w), kThreads, 0,
            as_stream(stream), g, dev(gy), argmax, dev(gx));
}

template <class T>
void avg_pool2d_forward(const Pool2dGeometry& g, const T* x, T* y, bool count_include_pad,
                        void* stream) {
  using D = device_t<T>;
  if (!check_geometry("avg_pool2d_forward", g)) return;
  RG_LAUNCH(avg_pool2d_forward_kernel<D>, blocks_for(g.planes * g.ho * g.wo), kThreads, 0,
            as_stream(stream), g, dev(x), dev(y), count_include_pad);
}

template <class T>
void avg_pool2d_backward(const Pool2dGeometry& g, const T* gy, T* gx, bool count_include_pad,
                         void* stream) {
  using D = device_t<T>;
  if (!check_geometry("avg_pool2d_backward", g)) return;
  RG_LAUNCH(avg_pool2d_backward_kernel<D>, blocks_for(g.planes * g.h * g.w), kThreads, 0,
            as_stream(stream), g, dev(gy), dev(gx), count_include_pad);
}

template <class T>
void adaptive_avg_pool2d_1x1_forward(const T* x, T* y, int64_t planes, int64_t hw, void* stream) {
  using D = device_t<T>;
  RG_CHECK(planes >= 0 && hw > 0,
           "adaptive_avg_pool2d_1x1_forward: needs planes >= 0 and hw > 0, got ", planes, " and ",
           hw);
  if (planes == 0) return;
  const auto threads =
      static_cast<unsigned int>(std::clamp<int64_t>((hw + 31) / 32 * 32, 32, kPlaneThreads));
  RG_LAUNCH(global_avg_pool_kernel<D>, static_cast<unsigned int>(std::min(planes, kMaxGrid)),
            threads, 0, as_stream(stream), dev(x), dev(y), planes, hw);
}

template <class T>
void adaptive_avg_pool2d_1x1_backward(const T* gy, T* gx, int64_t planes, int64_t hw,
                                      void* stream) {
  using D = device_t<T>;
  RG_CHECK(planes >= 0 && hw > 0,
           "adaptive_avg_pool2d_1x1_backward: needs planes >= 0 and hw > 0, got ", planes, " and ",
           hw);
  if (planes == 0) return;
  RG_LAUNCH(global_avg_pool_backward_kernel<D>, blocks_for(planes * hw), kThreads, 0,
            as_stream(stream), dev(gy), dev(gx), planes, hw);
}

#define RG_INSTANTIATE_POOL(T)                                                               \
  template void max_pool2d_forward<T>(const Pool2dGeometry&, const T*, T*, int64_t*, void*); \
  template void max_pool2d_backward<T>(const Pool2dGeometry&, const T*, const int64_t*, T*,  \
                                       void*);                                               \
  template void avg_pool2d_forward<T>(const Pool2dGeometry&, const T*, T*, bool, void*);     \
  template void avg_pool2d_backward<T>(const Pool2dGeometry&, const T*, T*, bool, void*);    \
  template void adaptive_avg_pool2d_1x1_forward<T>(const T*, T*, int64_t, int64_t, void*);   \
  template void adaptive_avg_pool2d_1x1_backward<T>(const T*, T*, int64_t, int64_t, void*);
RG_INSTANTIATE_POOL(float)
RG_INSTANTIATE_POOL(double)
RG_INSTANTIATE_POOL(Half)
RG_INSTANTIATE_POOL(BFloat16)
#undef RG_INSTANTIATE_POOL

}  // namespace rg::kernels::cuda
