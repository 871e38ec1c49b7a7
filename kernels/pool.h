// The pooling kernels, one contract for both backends (kernels/backend.h): 2-D max and average
// pooling on NCHW or channels-last arrays (floor mode), forward and backward, and global average
// pooling (adaptive_avg_pool2d to 1x1). kernels/cpu/pool.cpp defines Pool<Cpu> (f32, f64),
// kernels/cuda/pool.cu Pool<Cuda> (f32, f64, f16, bf16); every pointer is on the backend's
// device. cuDNN's average pooling, a CUDA-only alternative, is kernels/cuda/pool_cudnn.h.
//
// Shared rules:
//   - The geometry is checked the same way on both backends (detail::check_pool2d_geometry):
//     positive kernel and stride, padding between 0 and half the kernel, and ho/wo of floor mode.
//   - Window values are visited row by row, and a window's sum accumulates in the compute type
//     (f64 for f64, f32 otherwise); backward passes add each input's contributions in the order
//     of the outputs (row by row), starting from 0, so both backends give the same bits. The CUDA
//     backward gathers (one thread per input pixel) instead of scattering with atomics.
//   - Global average pooling sums each plane in f64 and rounds the mean once, so the order in
//     which a backend adds (sequential on the CPU, a block tree on CUDA) does not show.
//   - Results do not depend on the thread count or timing.
//   - Channels last (PyTorch's torch.channels_last) is the logical [n, c, h, w] array laid out as
//     [n, h, w, c]. Only the addresses change: each value is computed as in NCHW (same window
//     order, accumulation type and backward order), so the results are the NCHW results
//     transposed, bit for bit. argmax keeps its meaning (an index inside the input plane) and is
//     laid out like y.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

// planes = n * c independent planes of h x w; the caller computes ho and wo (floor mode):
// ho = (h + 2 * ph - kh) / sh + 1, likewise wo. With channels_last, x is [n, h, w, c] and y
// [n, ho, wo, c] in memory, n = planes / c; c is read only then.
struct Pool2dGeometry {
  int64_t planes, h, w;
  int64_t kh, kw, sh, sw, ph, pw;
  int64_t ho, wo;
  int64_t c = 0;
  bool channels_last = false;
};

template <class B>
struct Pool {
  // y = the window maxima (padding counts as -inf; NaN wins, as in PyTorch); argmax holds each
  // maximum's index inside its input plane (ih * w + iw), the first one on ties.
  template <class T>
  static void max_pool2d(const Pool2dGeometry& g, const T* x, T* y, int64_t* argmax, Ctx ctx);
  // gx[j] = sum of gy over the outputs whose argmax is j (argmax from max_pool2d).
  template <class T>
  static void max_pool2d_backward(const Pool2dGeometry& g, const T* gy, const int64_t* argmax,
                                  T* gx, Ctx ctx);

  // y = window sums divided by the window size clipped to the padded input (count_include_pad)
  // or to the input itself.
  template <class T>
  static void avg_pool2d(const Pool2dGeometry& g, const T* x, T* y, bool count_include_pad,
                         Ctx ctx);
  // gx[j] = sum over the windows containing j of gy / that window's divisor.
  template <class T>
  static void avg_pool2d_backward(const Pool2dGeometry& g, const T* gy, T* gx,
                                  bool count_include_pad, Ctx ctx);

  // y[p] = mean of the hw values of plane p, summed in f64 (adaptive_avg_pool2d with output size
  // (1, 1)).
  template <class T>
  static void adaptive_avg_pool2d_1x1(const T* x, T* y, int64_t planes, int64_t hw, Ctx ctx);
  // gx[p, i] = gy[p] / hw
  template <class T>
  static void adaptive_avg_pool2d_1x1_backward(const T* gy, T* gx, int64_t planes, int64_t hw,
                                               Ctx ctx);

  // The same on channels-last input: x is [n, hw, c], y [n, c] (the memory of NCHW [n, c, 1, 1]);
  // each mean sums i = 0..hw-1 in order in f64 and rounds once (one CUDA thread per mean, reading
  // consecutive channels across a warp).
  template <class T>
  static void adaptive_avg_pool2d_1x1_channels_last(const T* x, T* y, int64_t n, int64_t c,
                                                    int64_t hw, Ctx ctx);
  // gx[n, i, ch] = gy[n, ch] / hw
  template <class T>
  static void adaptive_avg_pool2d_1x1_channels_last_backward(const T* gy, T* gx, int64_t n,
                                                             int64_t c, int64_t hw, Ctx ctx);
};

namespace detail {

// Whether there is any output; throws for an inconsistent geometry (whose windows could leave the
// padded input).
inline bool check_pool2d_geometry(const char* op, const Pool2dGeometry& g) {
  RG_CHECK(g.planes >= 0 && g.h >= 0 && g.w >= 0, op, ": sizes must be non-negative");
  RG_CHECK(g.kh > 0 && g.kw > 0 && g.sh > 0 && g.sw > 0, op, ": kernel (", g.kh, ", ", g.kw,
           ") and stride (", g.sh, ", ", g.sw, ") must be positive");
  RG_CHECK(g.ph >= 0 && g.pw >= 0 && 2 * g.ph <= g.kh && 2 * g.pw <= g.kw, op, ": padding (", g.ph,
           ", ", g.pw, ") must be between 0 and half the kernel");
  RG_CHECK(!g.channels_last || (g.c > 0 && g.planes % g.c == 0), op,
           ": channels last needs c > 0 dividing planes (n * c), got c = ", g.c,
           " and planes = ", g.planes);
  if (g.planes == 0) return false;
  RG_CHECK(g.h > 0 && g.w > 0 && g.h + 2 * g.ph >= g.kh && g.w + 2 * g.pw >= g.kw, op, ": input ",
           g.h, "x", g.w, " with padding (", g.ph, ", ", g.pw, ") is smaller than the kernel (",
           g.kh, ", ", g.kw, ")");
  RG_CHECK(g.ho == (g.h + 2 * g.ph - g.kh) / g.sh + 1 && g.wo == (g.w + 2 * g.pw - g.kw) / g.sw + 1,
           op, ": output ", g.ho, "x", g.wo, " does not match input ", g.h, "x", g.w,
           " (floor mode)");
  return true;
}

// Whether there is any output of global average pooling; throws for bad sizes.
inline bool check_global_pool_sizes(const char* op, int64_t planes, int64_t hw) {
  RG_CHECK(planes >= 0 && hw > 0, op, ": needs planes >= 0 and hw > 0, got ", planes, " and ", hw);
  return planes > 0;
}

// The same for channels-last global average pooling of n images of c channels.
inline bool check_global_pool_sizes(const char* op, int64_t n, int64_t c, int64_t hw) {
  RG_CHECK(n >= 0 && c >= 0 && hw > 0, op, ": needs n >= 0, c >= 0 and hw > 0, got ", n, ", ", c,
           " and ", hw);
  return n > 0 && c > 0;
}

}  // namespace detail
}  // namespace rg::kernels
