// The pooling kernels on the CPU (kernels/pool.h): loops parallel over planes, each window's
// bounds clipped once per output pixel, so padding never needs a padded copy of the input.
// Channels last runs parallel over blocks of an image's channels, the innermost loop over the
// channels of a block (contiguous in memory), with each channel's values visited as in NCHW.
#include "kernels/pool.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {

// Planes per parallel task: enough pixels that a task outweighs its scheduling.
int64_t plane_grain(int64_t pixels) {
  return std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(pixels, 1));
}

// Runs fn(p) for every plane p in parallel, with at most ctx.threads threads.
template <class F>
void for_each_plane(int64_t planes, int64_t pixels, Ctx ctx, F&& fn) {
  cpu::parallel_for(
      0, planes, plane_grain(pixels),
      [&](int64_t lo, int64_t hi) {
        for (int64_t p = lo; p < hi; ++p) fn(p);
      },
      ctx.threads);
}

// Window [h0, h1) x [w0, w1) of output pixel (oh, ow) inside the padded input (for the
// count_include_pad divisor) and inside the input itself.
struct Window {
  int64_t h0, h1, w0, w1;  // clipped to the input
  int64_t padded_size;     // clipped to the padded input
};

Window window(const Pool2dGeometry& g, int64_t oh, int64_t ow) {
  const int64_t hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
  const int64_t he = std::min(hs + g.kh, g.h + g.ph), we = std::min(ws + g.kw, g.w + g.pw);
  return {std::max<int64_t>(hs, 0), std::min(he, g.h), std::max<int64_t>(ws, 0), std::min(we, g.w),
          (he - hs) * (we - ws)};
}

int64_t divisor(const Window& win, bool count_include_pad) {
  return count_include_pad ? win.padded_size : (win.h1 - win.h0) * (win.w1 - win.w0);
}

// The first maximum of a window (padding would be -inf, so it never wins); a NaN wins and ends
// the search, as PyTorch propagates NaN.
template <class T>
int64_t window_argmax(const T* in, int64_t w, const Window& win) {
  int64_t best_i = win.h0 * w + win.w0;
  T best = -std::numeric_limits<T>::infinity();
  for (int64_t ih = win.h0; ih < win.h1; ++ih) {
    for (int64_t iw = win.w0; iw < win.w1; ++iw) {
      const T v = in[ih * w + iw];
      if (std::isnan(v)) return ih * w + iw;
      if (v > best) {
        best = v;
        best_i = ih * w + iw;
      }
    }
  }
  return best_i;
}

// The 2x2, stride-2, unpadded window (ToyNet's and most CNNs' pooling) with the same rules as
// window_argmax: a window holding a NaN (rare; one well-predicted branch) takes the general path,
// the others find the first maximum without branches. A branch per comparison is mispredicted
// about half the time on activations.
template <class T>
void max_pool_2x2_plane(const T* in, int64_t w, int64_t ho, int64_t wo, T* out, int64_t* idx) {
  for (int64_t oh = 0; oh < ho; ++oh) {
    for (int64_t ow = 0; ow < wo; ++ow) {
      const int64_t i0 = 2 * oh * w + 2 * ow, i1 = i0 + w;
      const T a = in[i0], b = in[i0 + 1], c = in[i1], d = in[i1 + 1];
      int64_t best_i;
      if ((a != a) | (b != b) | (c != c) | (d != d)) [[unlikely]] {
        best_i = window_argmax(in, w, Window{2 * oh, 2 * oh + 2, 2 * ow, 2 * ow + 2, 4});
      } else {
        // The maximum by maxss-style selects, then the first position holding it (ties compare
        // equal, -0 == +0 included, so this is the strict scan's first maximum) by arithmetic:
        // pos 0..3 in scan order. GCC turns float-conditioned selects into branches; integer
        // arithmetic it cannot.
        const T m = std::max(std::max(a, b), std::max(c, d));
        const int64_t ea = a == m, eb = b == m, ec = c == m;
        const int64_t pos = (1 - ea) * (1 + (1 - eb) * (1 + (1 - ec)));
        best_i = i0 + (pos & 1) + (pos >> 1) * w;
      }
      out[oh * wo + ow] = in[best_i];
      idx[oh * wo + ow] = best_i;
    }
  }
}

// Channels per channels-last task: contiguous at every pixel, and the size of the accumulators
// kept on the stack.
constexpr int64_t kChannelBlock = 64;

// Runs fn(image, c0, c1) for channels [c0, c1) of every image in parallel, with at most
// ctx.threads threads; pixels: the work per channel.
template <class F>
void for_each_channel_block(int64_t n, int64_t c, int64_t pixels, Ctx ctx, F&& fn) {
  const int64_t blocks = (c + kChannelBlock - 1) / kChannelBlock;
  cpu::parallel_for(
      0, n * blocks, plane_grain(pixels * std::min(c, kChannelBlock)),
      [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          const int64_t c0 = t % blocks * kChannelBlock;
          fn(t / blocks, c0, std::min(c0 + kChannelBlock, c));
        }
      },
      ctx.threads);
}

// window_argmax for channels [c0, c1) at once: x is [n, h, w, c], y and argmax [n, ho, wo, c].
// Stops updating a channel once its maximum is NaN, as window_argmax returns at the first NaN.
template <class T>
void max_pool2d_channels_last(const Pool2dGeometry& g, const T* x, T* y, int64_t* argmax, Ctx ctx) {
  const int64_t c = g.c;
  for_each_channel_block(g.planes / c, c, g.h * g.w, ctx, [&](int64_t b, int64_t c0, int64_t c1) {
    const T* in = x + b * g.h * g.w * c + c0;
    const int64_t width = c1 - c0;
    T best[kChannelBlock];
    int64_t best_i[kChannelBlock];
    for (int64_t oh = 0; oh < g.ho; ++oh) {
      for (int64_t ow = 0; ow < g.wo; ++ow) {
        const Window win = window(g, oh, ow);
        std::fill_n(best, width, -std::numeric_limits<T>::infinity());
        std::fill_n(best_i, width, win.h0 * g.w + win.w0);
        for (int64_t ih = win.h0; ih < win.h1; ++ih) {
          for (int64_t iw = win.w0; iw < win.w1; ++iw) {
            const int64_t j = ih * g.w + iw;
            const T* v = in + j * c;
            for (int64_t k = 0; k < width; ++k) {
              const bool take = best[k] == best[k] && (v[k] != v[k] || v[k] > best[k]);
              best[k] = take ? v[k] : best[k];
              best_i[k] = take ? j : best_i[k];
            }
          }
        }
        const int64_t o = ((b * g.ho + oh) * g.wo + ow) * c + c0;
        std::copy_n(best, width, y + o);
        std::copy_n(best_i, width, argmax + o);
      }
    }
  });
}

// Scatters as the NCHW backward does: each input's contributions in the order of the outputs.
template <class T>
void max_pool2d_backward_channels_last(const Pool2dGeometry& g, const T* gy, const int64_t* argmax,
                                       T* gx, Ctx ctx) {
  const int64_t c = g.c;
  for_each_channel_block(g.planes / c, c, g.h * g.w, ctx, [&](int64_t b, int64_t c0, int64_t c1) {
    T* out = gx + b * g.h * g.w * c + c0;
    for (int64_t j = 0; j < g.h * g.w; ++j) std::fill_n(out + j * c, c1 - c0, T(0));
    const T* grad = gy + b * g.ho * g.wo * c + c0;
    const int64_t* idx = argmax + b * g.ho * g.wo * c + c0;
    for (int64_t i = 0; i < g.ho * g.wo; ++i) {
      for (int64_t k = 0; k < c1 - c0; ++k) out[idx[i * c + k] * c + k] += grad[i * c + k];
    }
  });
}

template <class T>
void avg_pool2d_channels_last(const Pool2dGeometry& g, const T* x, T* y, bool count_include_pad,
                              Ctx ctx) {
  const int64_t c = g.c;
  for_each_channel_block(g.planes / c, c, g.h * g.w, ctx, [&](int64_t b, int64_t c0, int64_t c1) {
    const T* in = x + b * g.h * g.w * c + c0;
    const int64_t width = c1 - c0;
    T acc[kChannelBlock];
    for (int64_t oh = 0; oh < g.ho; ++oh) {
      for (int64_t ow = 0; ow < g.wo; ++ow) {
        const Window win = window(g, oh, ow);
        std::fill_n(acc, width, T(0));
        for (int64_t ih = win.h0; ih < win.h1; ++ih) {
          for (int64_t iw = win.w0; iw < win.w1; ++iw) {
            const T* v = in + (ih * g.w + iw) * c;
            for (int64_t k = 0; k < width; ++k) acc[k] += v[k];
          }
        }
        const T div = T(divisor(win, count_include_pad));
        T* out = y + ((b * g.ho + oh) * g.wo + ow) * c + c0;
        for (int64_t k = 0; k < width; ++k) out[k] = acc[k] / div;
      }
    }
  });
}

template <class T>
void avg_pool2d_backward_channels_last(const Pool2dGeometry& g, const T* gy, T* gx,
                                       bool count_include_pad, Ctx ctx) {
  const int64_t c = g.c;
  for_each_channel_block(g.planes / c, c, g.h * g.w, ctx, [&](int64_t b, int64_t c0, int64_t c1) {
    T* out = gx + b * g.h * g.w * c + c0;
    const int64_t width = c1 - c0;
    for (int64_t j = 0; j < g.h * g.w; ++j) std::fill_n(out + j * c, width, T(0));
    T share[kChannelBlock];
    for (int64_t oh = 0; oh < g.ho; ++oh) {
      for (int64_t ow = 0; ow < g.wo; ++ow) {
        const Window win = window(g, oh, ow);
        const T div = T(divisor(win, count_include_pad));
        const T* grad = gy + ((b * g.ho + oh) * g.wo + ow) * c + c0;
        for (int64_t k = 0; k < width; ++k) share[k] = grad[k] / div;
        for (int64_t ih = win.h0; ih < win.h1; ++ih) {
          for (int64_t iw = win.w0; iw < win.w1; ++iw) {
            T* o = out + (ih * g.w + iw) * c;
            for (int64_t k = 0; k < width; ++k) o[k] += share[k];
          }
        }
      }
    }
  });
}

}  // namespace

template <>
template <class T>
void Pool<Cpu>::max_pool2d(const Pool2dGeometry& g, const T* x, T* y, int64_t* argmax, Ctx ctx) {
  if (!detail::check_pool2d_geometry("max_pool2d", g)) return;
  if (g.channels_last) return max_pool2d_channels_last(g, x, y, argmax, ctx);
  const bool two_by_two = g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 &&
                          g.pw == 0 && 2 * g.ho <= g.h && 2 * g.wo <= g.w;
  for_each_plane(g.planes, g.h * g.w, ctx, [&](int64_t p) {
    const T* in = x + p * g.h * g.w;
    T* out = y + p * g.ho * g.wo;
    int64_t* idx = argmax + p * g.ho * g.wo;
    if (two_by_two) return max_pool_2x2_plane(in, g.w, g.ho, g.wo, out, idx);
    for (int64_t oh = 0; oh < g.ho; ++oh) {
      for (int64_t ow = 0; ow < g.wo; ++ow) {
        const int64_t best = window_argmax(in, g.w, window(g, oh, ow));
        out[oh * g.wo + ow] = in[best];
        idx[oh * g.wo + ow] = best;
      }
    }
  });
}

template <>
template <class T>
void Pool<Cpu>::max_pool2d_backward(const Pool2dGeometry& g, const T* gy, const int64_t* argmax,
                                    T* gx, Ctx ctx) {
  if (!detail::check_pool2d_geometry("max_pool2d_backward", g)) return;
  if (g.channels_last) return max_pool2d_backward_channels_last(g, gy, argmax, gx, ctx);
  for_each_plane(g.planes, g.h * g.w, ctx, [&](int64_t p) {
    T* out = gx + p * g.h * g.w;
    std::fill_n(out, g.h * g.w, T(0));
    const T* grad = gy + p * g.ho * g.wo;
    const int64_t* idx = argmax + p * g.ho * g.wo;
    for (int64_t i = 0; i < g.ho * g.wo; ++i) out[idx[i]] += grad[i];
  });
}

template <>
template <class T>
void Pool<Cpu>::avg_pool2d(const Pool2dGeometry& g, const T* x, T* y, bool count_include_pad,
                           Ctx ctx) {
  if (!detail::check_pool2d_geometry("avg_pool2d", g)) return;
  if (g.channels_last) return avg_pool2d_channels_last(g, x, y, count_include_pad, ctx);
  for_each_plane(g.planes, g.h * g.w, ctx, [&](int64_t p) {
    const T* in = x + p * g.h * g.w;
    T* out = y + p * g.ho * g.wo;
    for (int64_t oh = 0; oh < g.ho; ++oh) {
      for (int64_t ow = 0; ow < g.wo; ++ow) {
        const Window win = window(g, oh, ow);
        T acc = 0;
        for (int64_t ih = win.h0; ih < win.h1; ++ih) {
          for (int64_t iw = win.w0; iw < win.w1; ++iw) acc += in[ih * g.w + iw];
        }
        out[oh * g.wo + ow] = acc / T(divisor(win, count_include_pad));
      }
    }
  });
}

template <>
template <class T>
void Pool<Cpu>::avg_pool2d_backward(const Pool2dGeometry& g, const T* gy, T* gx,
                                    bool count_include_pad, Ctx ctx) {
  if (!detail::check_pool2d_geometry("avg_pool2d_backward", g)) return;
  if (g.channels_last) return avg_pool2d_backward_channels_last(g, gy, gx, count_include_pad, ctx);
  for_each_plane(g.planes, g.h * g.w, ctx, [&](int64_t p) {
    T* out = gx + p * g.h * g.w;
    std::fill_n(out, g.h * g.w, T(0));
    const T* grad = gy + p * g.ho * g.wo;
    for (int64_t oh = 0; oh < g.ho; ++oh) {
      for (int64_t ow = 0; ow < g.wo; ++ow) {
        const Window win = window(g, oh, ow);
        const T share = grad[oh * g.wo + ow] / T(divisor(win, count_include_pad));
        for (int64_t ih = win.h0; ih < win.h1; ++ih) {
          for (int64_t iw = win.w0; iw < win.w1; ++iw) out[ih * g.w + iw] += share;
        }
      }
    }
  });
}

template <>
template <class T>
void Pool<Cpu>::adaptive_avg_pool2d_1x1(const T* x, T* y, int64_t planes, int64_t hw, Ctx ctx) {
  if (!detail::check_global_pool_sizes("adaptive_avg_pool2d_1x1", planes, hw)) return;
  for_each_plane(planes, hw, ctx, [&](int64_t p) {
    const T* in = x + p * hw;
    double acc = 0;
    for (int64_t i = 0; i < hw; ++i) acc += double(in[i]);
    y[p] = T(acc / double(hw));
  });
}

template <>
template <class T>
void Pool<Cpu>::adaptive_avg_pool2d_1x1_backward(const T* gy, T* gx, int64_t planes, int64_t hw,
                                                 Ctx ctx) {
  if (!detail::check_global_pool_sizes("adaptive_avg_pool2d_1x1_backward", planes, hw)) return;
  for_each_plane(planes, hw, ctx, [&](int64_t p) { std::fill_n(gx + p * hw, hw, gy[p] / T(hw)); });
}

template <>
template <class T>
void Pool<Cpu>::adaptive_avg_pool2d_1x1_channels_last(const T* x, T* y, int64_t n, int64_t c,
                                                      int64_t hw, Ctx ctx) {
  if (!detail::check_global_pool_sizes("adaptive_avg_pool2d_1x1_channels_last", n, c, hw)) return;
  for_each_channel_block(n, c, hw, ctx, [&](int64_t b, int64_t c0, int64_t c1) {
    const T* in = x + b * hw * c + c0;
    const int64_t width = c1 - c0;
    double acc[kChannelBlock] = {};
    for (int64_t i = 0; i < hw; ++i) {
      for (int64_t k = 0; k < width; ++k) acc[k] += double(in[i * c + k]);
    }
    for (int64_t k = 0; k < width; ++k) y[b * c + c0 + k] = T(acc[k] / double(hw));
  });
}

template <>
template <class T>
void Pool<Cpu>::adaptive_avg_pool2d_1x1_channels_last_backward(const T* gy, T* gx, int64_t n,
                                                               int64_t c, int64_t hw, Ctx ctx) {
  if (!detail::check_global_pool_sizes("adaptive_avg_pool2d_1x1_channels_last_backward", n, c, hw))
    return;
  for_each_channel_block(n, c, hw, ctx, [&](int64_t b, int64_t c0, int64_t c1) {
    const T* grad = gy + b * c;
    for (int64_t i = 0; i < hw; ++i) {
      T* out = gx + (b * hw + i) * c;
      for (int64_t k = c0; k < c1; ++k) out[k] = grad[k] / T(hw);
    }
  });
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_pool_kernels() {
  using K = Pool<Cpu>;
  return std::tuple{&K::max_pool2d<T>,
                    &K::max_pool2d_backward<T>,
                    &K::avg_pool2d<T>,
                    &K::avg_pool2d_backward<T>,
                    &K::adaptive_avg_pool2d_1x1<T>,
                    &K::adaptive_avg_pool2d_1x1_backward<T>,
                    &K::adaptive_avg_pool2d_1x1_channels_last<T>,
                    &K::adaptive_avg_pool2d_1x1_channels_last_backward<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_pool_kernels)

}  // namespace rg::kernels
