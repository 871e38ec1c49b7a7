// Convolution as GEMM. Work is cut into chunks, each one column matrix [c*kh*kw, columns] and one
// GEMM: several whole samples when feature maps are small (so 4x4 maps still give wide GEMMs),
// or a block of output rows of one sample when a sample's columns would not fit the budget.
// Stride-1 convolutions on wide maps skip im2col (conv2d_forward_taps); stride-1 input
// gradients are forward convolutions. Each thread runs whole chunks with single-threaded
// OpenBLAS GEMMs (see SingleThreadedBlas).
#include "kernels/cpu/conv2d.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/cpu/conv2d_onednn.h"
#include "kernels/cpu/conv2d_winograd.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/shape.h"

namespace rg::kernels::cpu {
namespace {

// Bytes of column matrix per chunk: wide GEMMs, yet written by im2col and read back by
// OpenBLAS's packing while still in the core's L2 cache.
constexpr int64_t kColumnBudgetBytes = int64_t(2) << 20;
// A chunk's GEMM packs the whole weight matrix once, so chunks of small maps get at least this
// many columns (stretching the budget up to 4x) to keep that packing small next to the GEMM.
constexpr int64_t kMinColumns = 256;
// Stride-1 convolutions skip im2col (see conv2d_forward_taps) when the junk columns that this
// costs are at most 1/kTapMaxWaste of the output columns (32-wide maps with 3x3 kernels).
constexpr int64_t kTapMaxWaste = 16;
// The weight gradient of small maps (batched chunks) is one GEMM over the whole batch, split by
// output channels among the threads, when the batch's column matrix is at most this big: a GEMM
// as deep as the batch, and no per-thread partial sums to add up afterwards.
constexpr int64_t kWholeBatchColumnBytes = int64_t(24) << 20;
// A 1x1 stride-1 unpadded convolution reads a sample's input as its column matrix (no im2col)
// once a sample is this many pixels; smaller maps are batched like the general case.
constexpr int64_t kDirectMinColumns = 512;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// nb samples from n0, output rows [oh0, oh1) of each (all rows whenever nb > 1).
struct Chunk {
  int64_t n0, nb, oh0, oh1;
  int64_t rows() const { return oh1 - oh0; }
};

struct Plan {
  int64_t k;       // rows of the column matrix: c * kh * kw
  int64_t hw;      // output pixels per sample
  int64_t nb;      // samples per chunk
  int64_t rows;    // output rows per chunk
  int64_t blocks;  // row blocks per sample (1 when nb > 1)
  int64_t chunks;
  int64_t workers;
  bool direct;  // 1x1, stride 1, no padding: the input already is the column matrix

  // One-sample chunks of a direct convolution read the input in place (no im2col, no copy).
  bool in_place() const { return direct && nb == 1; }
  int64_t cols_size(const Conv2dGeometry& g) const { return in_place() ? 0 : k * nb * rows * g.wo; }
  Chunk chunk(const Conv2dGeometry& g, int64_t j) const {
    if (blocks == 1) return {j * nb, std::min(nb, g.n - j * nb), 0, g.ho};
    const int64_t oh0 = (j % blocks) * rows;
    return {j / blocks, 1, oh0, std::min(g.ho, oh0 + rows)};
  }
};

// split_rows = false keeps samples whole (col2im adds into input rows that neighbouring row
// blocks share, so those may not run concurrently).
Plan make_plan(const Conv2dGeometry& g, int64_t element_size, bool split_rows) {
  Plan p;
  p.k = g.c * g.kh * g.kw;
  p.hw = g.ho * g.wo;
  p.direct = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
  const int64_t threads = num_threads(), n = std::max<int64_t>(g.n, 1);
  const int64_t per_sample = std::max<int64_t>(p.k * p.hw * element_size, 1);
  const bool batch = p.direct ? p.hw < kDirectMinColumns : per_sample <= kColumnBudgetBytes;
  if (batch && n >= threads) {
    // As many samples per chunk as the budget allows, with a chunk count that divides evenly
    // among the threads.
    const int64_t wide_enough =
        std::min(ceil_div(kMinColumns, p.hw), 4 * kColumnBudgetBytes / per_sample);
    const int64_t nb_max =
        std::clamp<int64_t>(std::max(kColumnBudgetBytes / per_sample, wide_enough), 1, n);
    const int64_t chunks = std::min(n, ceil_div(ceil_div(n, nb_max), threads) * threads);
    p.nb = ceil_div(n, chunks);
    p.rows = g.ho;
    p.blocks = 1;
    p.chunks = ceil_div(n, p.nb);
  } else {
    // One sample per chunk, cut into row blocks that fit the budget and, for batches smaller
    // than the thread count, give every thread some rows.
    p.nb = 1;
    int64_t blocks = 1;
    if (split_rows) {
      blocks =
          std::max(p.direct ? 1 : ceil_div(per_sample, kColumnBudgetBytes), ceil_div(threads, n));
    }
    p.rows = ceil_div(g.ho, std::min(blocks, g.ho));
    p.blocks = ceil_div(g.ho, p.rows);
    p.chunks = n * p.blocks;
  }
  p.workers = std::min(threads, p.chunks);
  return p;
}

// Runs body(worker, chunk) for every chunk; worker w takes a fixed contiguous run of chunks, so
// that sums across chunks (the weight gradient) are added in the same order on every run. With
// one worker, the GEMMs use OpenBLAS's threads and the copies parallel_for.
template <class F>
void for_each_chunk(const Conv2dGeometry& g, const Plan& p, F&& body) {
  auto run_worker = [&](int64_t worker) {
    const int64_t lo = p.chunks * worker / p.workers, hi = p.chunks * (worker + 1) / p.workers;
    for (int64_t j = lo; j < hi; ++j) body(worker, p.chunk(g, j));
  };
  if (p.workers == 1) {
    run_worker(0);
    return;
  }
  SingleThreadedBlas single;
  parallel_for(0, p.workers, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t worker = lo; worker < hi; ++worker) run_worker(worker);
  });
}

// Rows [r0, r1) of a channel plane in padded coordinates, zero padding written out, into dst
// (rows of wp = w + 2*pw values).
template <class T>
void pad_rows(const Conv2dGeometry& g, const T* plane, int64_t r0, int64_t r1, T* dst) {
  const int64_t wp = g.w + 2 * g.pw;
  for (int64_t r = r0; r < r1; ++r, dst += wp) {
    const int64_t ih = r - g.ph;
    if (ih < 0 || ih >= g.h) {
      std::fill_n(dst, wp, T(0));
      continue;
    }
    std::fill_n(dst, g.pw, T(0));
    std::copy_n(plane + ih * g.w, g.w, dst + g.pw);
    std::fill_n(dst + g.pw + g.w, g.pw, T(0));
  }
}

// The same rows for the im2col loops, which then need no bounds checks: returns P with
// P[(r - r0) * wp + col] = padded[r][col]. Without padding that is the plane itself; else a
// per-thread buffer, reused.
template <class T>
const T* padded_rows(const Conv2dGeometry& g, const T* plane, int64_t r0, int64_t r1) {
  if (g.ph == 0 && g.pw == 0) return plane + r0 * g.w;
  thread_local std::vector<T> buf;
  buf.resize(size_t((r1 - r0) * (g.w + 2 * g.pw)));
  pad_rows(g, plane, r0, r1, buf.data());
  return buf.data();
}

// cols[(ci*kh + ki)*kw + kj][s*seg + (oh - oh0)*wo + ow]
//   = x[s, ci, oh*sh - ph + ki*dh, ow*sw - pw + kj*dw]  (0 in the padding)
// for the chunk's samples (x points at its first) and rows, seg = rows * wo. A job is one
// channel: its kh*kw rows are then written front to back as s grows, which the hardware
// prefetchers follow even when a sample's piece of a row is one cache line (4x4 maps).
template <class T>
void im2col(const Conv2dGeometry& g, const Chunk& c, const T* x, T* cols) {
  const int64_t seg = c.rows() * g.wo, ld = c.nb * seg, wp = g.w + 2 * g.pw;
  const int64_t r0 = c.oh0 * g.sh, r1 = (c.oh1 - 1) * g.sh + (g.kh - 1) * g.dh + 1;
  parallel_for(0, g.c, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t ci = lo; ci < hi; ++ci) {
      for (int64_t s = 0; s < c.nb; ++s) {
        const T* src = padded_rows(g, x + (s * g.c + ci) * g.h * g.w, r0, r1);
        for (int64_t ki = 0; ki < g.kh; ++ki) {
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            T* dst = cols + ((ci * g.kh + ki) * g.kw + kj) * ld + s * seg;
            const T* base = src + ki * g.dh * wp + kj * g.dw;
            for (int64_t oh = 0; oh < c.rows(); ++oh) {
              const T* r = base + oh * g.sh * wp;
              T* d = dst + oh * g.wo;
              if (g.sw == 1) {
                for (int64_t ow = 0; ow < g.wo; ++ow) d[ow] = r[ow];
              } else {
                for (int64_t ow = 0; ow < g.wo; ++ow) d[ow] = r[ow * g.sw];
              }
            }
          }
        }
      }
    }
  });
}

// The adjoint of im2col for chunks of whole samples: gx[s, ci] = the sum of the column entries
// that read each input pixel, accumulated in a padded plane whose border is then dropped. One
// job owns one (sample, channel) plane, so no two threads add into the same pixel.
template <class T>
void col2im(const Conv2dGeometry& g, const Chunk& c, const T* cols, T* gx) {
  const int64_t ld = c.nb * g.ho * g.wo, wp = g.w + 2 * g.pw, hp = g.h + 2 * g.ph;
  const bool padded = g.ph != 0 || g.pw != 0;
  parallel_for(0, c.nb * g.c, 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<T> buf;
    if (padded) buf.resize(size_t(hp * wp));
    for (int64_t job = lo; job < hi; ++job) {
      const int64_t s = job / g.c, ci = job % g.c;
      T* out = gx + job * g.h * g.w;
      T* acc = padded ? buf.data() : out;
      std::fill_n(acc, hp * wp, T(0));
      for (int64_t ki = 0; ki < g.kh; ++ki) {
        for (int64_t kj = 0; kj < g.kw; ++kj) {
          const T* src = cols + ((ci * g.kh + ki) * g.kw + kj) * ld + s * g.ho * g.wo;
          T* base = acc + ki * g.dh * wp + kj * g.dw;
          for (int64_t oh = 0; oh < g.ho; ++oh) {
            T* r = base + oh * g.sh * wp;
            const T* d = src + oh * g.wo;
            if (g.sw == 1) {
              for (int64_t ow = 0; ow < g.wo; ++ow) r[ow] += d[ow];
            } else {
              for (int64_t ow = 0; ow < g.wo; ++ow) r[ow * g.sw] += d[ow];
            }
          }
        }
      }
      if (padded) {
        for (int64_t ih = 0; ih < g.h; ++ih) {
          std::copy_n(acc + (ih + g.ph) * wp + g.pw, g.w, out + ih * g.w);
        }
      }
    }
  });
}

// Between [nb, o, hw] (NCHW) and [o, nb * hw] (the GEMM's layout), adding bias on the way out.
template <class T>
void pack_channels(const T* src, int64_t nb, int64_t o, int64_t hw, T* dst) {
  parallel_for(0, nb * o, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t job = lo; job < hi; ++job) {
      const int64_t s = job / o, oc = job % o;
      std::memcpy(dst + oc * nb * hw + s * hw, src + job * hw, size_t(hw) * sizeof(T));
    }
  });
}

template <class T>
void unpack_channels(const T* src, const T* bias, int64_t nb, int64_t o, int64_t hw, T* dst) {
  parallel_for(0, nb * o, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t job = lo; job < hi; ++job) {
      const int64_t s = job / o, oc = job % o;
      const T* a = src + oc * nb * hw + s * hw;
      T* d = dst + job * hw;
      const T b = bias ? bias[oc] : T(0);
      for (int64_t i = 0; i < hw; ++i) d[i] = a[i] + b;
    }
  });
}

// The large per-worker buffers are allocated before the workers start, so that an allocation
// failure throws on the calling thread rather than inside an OpenMP region.
template <class T>
std::unique_ptr<T[]> scratch(int64_t n) {
  return std::make_unique_for_overwrite<T[]>(size_t(std::max<int64_t>(n, 1)));
}

// The column matrix of chunk c: the input itself for direct convolutions, else im2col into buf.
// Returns the matrix and its row stride.
template <class T>
std::pair<const T*, int64_t> columns(const Conv2dGeometry& g, const Plan& p, const Chunk& c,
                                     const T* x, T* buf) {
  const T* xs = x + c.n0 * g.c * g.h * g.w;
  if (p.in_place()) return {xs + c.oh0 * g.wo, p.hw};
  im2col(g, c, xs, buf);
  return {buf, c.nb * c.rows() * g.wo};
}

bool use_taps(const Conv2dGeometry& g) {
  return g.sh == 1 && g.sw == 1 && g.kh * g.kw > 1 &&
         (g.w + 2 * g.pw - g.wo) * kTapMaxWaste <= g.wo;
}

// Tap chunks are row blocks of one sample, sized so that the chunk's shifted input copies (see
// stack_shifted_rows) and its output rows each fit the column budget (and every thread gets rows
// when the batch is small). 64ch 32x32 3x3: 64 * 3 * 34 * 34 floats = 0.9 MB, one sample a chunk.
Plan make_tap_plan(const Conv2dGeometry& g, int64_t element_size) {
  Plan p{};
  p.k = g.c * g.kw;
  p.hw = g.ho * g.wo;
  p.nb = 1;
  const int64_t threads = num_threads(), n = std::max<int64_t>(g.n, 1);
  const int64_t wp = g.w + 2 * g.pw;
  const int64_t per_sample = std::max(p.k * (g.h + 2 * g.ph), g.o * g.ho) * wp * element_size;
  const int64_t blocks =
      std::min(g.ho, std::max(ceil_div(per_sample, kColumnBudgetBytes), ceil_div(threads, n)));
  p.rows = ceil_div(g.ho, blocks);
  p.blocks = ceil_div(g.ho, p.rows);
  p.chunks = n * p.blocks;
  p.workers = std::min(threads, p.chunks);
  return p;
}

// Stride-1 convolutions without im2col ("kn2row"). With the input rows zero-padded to wp values,
// output pixel (oh, ow) of tap (ki, kj) reads padded input (oh + ki*dh, ow + kj*dw): computing
// outputs on rows of wp instead of wo (the last wp - wo of each row are junk), the input of tap
// (ki, kj) is the padded input itself shifted by ki*dh*wp + kj*dw. A shift by kj*dw is not a
// row stride, so each chunk stores kw copies of its padded input rows, copy kj shifted by kj*dw:
// then row kernel ki is one matrix [c*kw, columns] (the copies shifted by ki*dh*wp), and the
// convolution is kh GEMMs with k = c*kw rather than kh*kw GEMMs with k = c (3x3 with 64
// channels: k = 192 runs near OpenBLAS's peak, k = 64 about 25% below it), at the cost of
// writing the input kw times instead of the kh*kw times of im2col.

// xs3[(ci*kw + kj) * ld + q] = padded[ci][r0 * wp + q + kj*dw] for q < ld = in_rows * wp (0
// past the chunk's rows), xs pointing at the sample.
template <class T>
void stack_shifted_rows(const Conv2dGeometry& g, const T* xs, int64_t r0, int64_t in_rows, T* xs3) {
  const int64_t wp = g.w + 2 * g.pw, ld = in_rows * wp;
  for (int64_t ci = 0; ci < g.c; ++ci) {
    T* copy0 = xs3 + ci * g.kw * ld;
    pad_rows(g, xs + ci * g.h * g.w, r0, r0 + in_rows, copy0);
    for (int64_t kj = 1; kj < g.kw; ++kj) {
      T* dst = copy0 + kj * ld;
      const int64_t shift = kj * g.dw;
      std::copy_n(copy0 + shift, ld - shift, dst);
      std::fill_n(dst + ld - shift, shift, T(0));
    }
  }
}

template <class T>
void conv2d_forward_taps(const Conv2dGeometry& g, const T* x, const T* w, const T* bias, T* y) {
  const Plan p = make_tap_plan(g, int64_t(sizeof(T)));
  const int64_t wp = g.w + 2 * g.pw, taps = g.kh * g.kw;
  const int64_t in_rows = p.rows + (g.kh - 1) * g.dh;  // padded input rows per chunk
  // w as kh x [o, c*kw].
  auto wt = scratch<T>(taps * g.o * g.c);
  for (int64_t ki = 0; ki < g.kh; ++ki) {
    for (int64_t oc = 0; oc < g.o; ++oc) {
      T* dst = wt.get() + (ki * g.o + oc) * p.k;
      for (int64_t ci = 0; ci < g.c; ++ci) {
        std::copy_n(w + ((oc * g.c + ci) * g.kh + ki) * g.kw, g.kw, dst + ci * g.kw);
      }
    }
  }
  auto in = scratch<T>(p.workers * p.k * in_rows * wp);
  auto out = scratch<T>(p.workers * g.o * p.rows * wp);
  for_each_chunk(g, p, [&](int64_t worker, const Chunk& c) {
    const int64_t rows = c.rows(), ld_in = (rows + (g.kh - 1) * g.dh) * wp;
    const int64_t columns = (rows - 1) * wp + g.wo;  // the last row's junk is not needed
    T* xp = in.get() + worker * p.k * in_rows * wp;
    T* yp = out.get() + worker * g.o * p.rows * wp;
    stack_shifted_rows(g, x + c.n0 * g.c * g.h * g.w, c.oh0, ld_in / wp, xp);
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      gemm<T>(false, false, g.o, columns, p.k, T(1), wt.get() + ki * g.o * p.k, p.k,
              xp + ki * g.dh * wp, ld_in, ki == 0 ? T(0) : T(1), yp, columns);
    }
    T* ys = y + c.n0 * g.o * p.hw + c.oh0 * g.wo;
    for (int64_t oc = 0; oc < g.o; ++oc) {
      const T b = bias ? bias[oc] : T(0);
      for (int64_t r = 0; r < rows; ++r) {
        const T* src = yp + oc * columns + r * wp;
        T* dst = ys + oc * p.hw + r * g.wo;
        if (bias) {
          for (int64_t ow = 0; ow < g.wo; ++ow) dst[ow] = src[ow] + b;
        } else {
          std::copy_n(src, g.wo, dst);
        }
      }
    }
  });
}

// The weight gradient on the same layout. For row kernel ki, gw[:, :, ki, :] as [c*kw, o] is
// the sum over chunks of the shifted copies [c*kw, columns] (shifted by ki*dh*wp) times
// gy^T [columns, o], gy's rows spread to wp values with zeros in the junk columns (so junk adds
// nothing). Rather than kh GEMMs with n = o, the shift moves to gy: kh copies of it, copy ki
// shifted right by ki*dh*wp (zeros before and after), make one GEMM
//   [c*kw, kh*o] = xs3 [c*kw, ld] * gy3^T [ld, kh*o],  ld = in_rows*wp - (wp - wo),
// whose larger output halves OpenBLAS's packing per flop (64 channels: 192 x 192 instead of
// 3 x 192 x 64, about 15% faster), for (kh-1)*dh*wp more columns of zeros per chunk (6% at 32x32).
// Each worker sums its chunks into its own [c*kw, kh*o] buffer; the buffers are added in worker
// order, so results do not depend on timing.
template <class T>
void conv2d_weight_grad_taps(const Conv2dGeometry& g, const T* x, const T* gy, T* gw) {
  const Plan p = make_tap_plan(g, int64_t(sizeof(T)));
  const int64_t wp = g.w + 2 * g.pw, ko = g.kh * g.o, part = p.k * ko;
  const int64_t in_rows = p.rows + (g.kh - 1) * g.dh;
  auto in = scratch<T>(p.workers * p.k * in_rows * wp);
  auto dy = scratch<T>(p.workers * ko * in_rows * wp);
  auto partial = scratch<T>(p.workers * part);
  std::vector<char> started(size_t(p.workers), 0);
  for_each_chunk(g, p, [&](int64_t worker, const Chunk& c) {
    const int64_t rows = c.rows(), ld_in = (rows + (g.kh - 1) * g.dh) * wp;
    const int64_t ld = ld_in - (wp - g.wo);  // the last row's junk is not needed
    T* xp = in.get() + worker * p.k * in_rows * wp;
    T* dp = dy.get() + worker * ko * in_rows * wp;
    stack_shifted_rows(g, x + c.n0 * g.c * g.h * g.w, c.oh0, ld_in / wp, xp);
    const T* gys = gy + c.n0 * g.o * p.hw + c.oh0 * g.wo;
    for (int64_t oc = 0; oc < g.o; ++oc) {
      T* row0 = dp + oc * ld;  // ki = 0: no shift
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(gys + oc * p.hw + r * g.wo, g.wo, row0 + r * wp);
        if (r + 1 < rows) std::fill_n(row0 + r * wp + g.wo, wp - g.wo, T(0));
      }
      const int64_t end = (rows - 1) * wp + g.wo;
      std::fill_n(row0 + end, ld - end, T(0));
      for (int64_t ki = 1; ki < g.kh; ++ki) {
        T* row = dp + (ki * g.o + oc) * ld;
        const int64_t shift = ki * g.dh * wp;
        std::fill_n(row, shift, T(0));
        std::copy_n(row0, ld - shift, row + shift);
      }
    }
    T* acc = partial.get() + worker * part;
    const T beta = started[size_t(worker)] ? T(1) : T(0);
    started[size_t(worker)] = 1;
    gemm<T>(false, true, p.k, ko, ld, T(1), xp, ld_in, dp, ld, beta, acc, ko);
  });
  // gw[oc, ci, ki, kj] = the sum over workers of partial[ci*kw + kj, ki*o + oc].
  parallel_for(0, g.o, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t oc = lo; oc < hi; ++oc) {
      for (int64_t ci = 0; ci < g.c; ++ci) {
        for (int64_t ki = 0; ki < g.kh; ++ki) {
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            const int64_t src = (ci * g.kw + kj) * ko + ki * g.o + oc;
            T sum = partial[size_t(src)];
            for (int64_t wk = 1; wk < p.workers; ++wk) sum += partial[size_t(wk * part + src)];
            gw[((oc * g.c + ci) * g.kh + ki) * g.kw + kj] = sum;
          }
        }
      }
    }
  });
}

}  // namespace

GemmShape conv2d_forward_gemm(const Conv2dGeometry& g, int64_t element_size) {
  if (use_taps(g)) {
    const Plan p = make_tap_plan(g, element_size);
    return {g.o, (p.rows - 1) * (g.w + 2 * g.pw) + g.wo, p.k};
  }
  const Plan p = make_plan(g, element_size, true);
  return {g.o, p.nb * p.rows * g.wo, p.k};
}

GemmShape conv2d_weight_grad_gemm(const Conv2dGeometry& g, int64_t element_size) {
  if (use_taps(g)) {
    const Plan p = make_tap_plan(g, element_size);
    const int64_t wp = g.w + 2 * g.pw;
    return {p.k, g.kh * g.o, (p.rows + (g.kh - 1) * g.dh - 1) * wp + g.wo};
  }
  const Plan p = make_plan(g, element_size, true);
  return {g.o, p.k, p.nb * p.rows * g.wo};
}

namespace {

template <class T>
void conv2d_forward(const Conv2dGeometry& g, const T* x, const T* w, const T* bias, T* y) {
  if (g.n == 0) return;
  if (use_taps(g)) {
    conv2d_forward_taps(g, x, w, bias, y);
    return;
  }
  const Plan p = make_plan(g, int64_t(sizeof(T)), true);
  const int64_t out_sample = g.o * p.hw;
  auto cols = scratch<T>(p.workers * p.cols_size(g));
  auto out = scratch<T>(p.nb == 1 ? 0 : p.workers * g.o * p.nb * p.hw);
  for_each_chunk(g, p, [&](int64_t worker, const Chunk& c) {
    const auto [b, ldb] = columns(g, p, c, x, cols.get() + worker * p.cols_size(g));
    const int64_t ld = c.nb * c.rows() * g.wo;
    if (c.nb == 1) {
      // One sample's rows: the GEMM writes y in place, on top of the broadcast bias.
      T* ys = y + c.n0 * out_sample + c.oh0 * g.wo;
      if (bias) {
        for (int64_t oc = 0; oc < g.o; ++oc) std::fill_n(ys + oc * p.hw, ld, bias[oc]);
      }
      gemm<T>(false, false, g.o, ld, p.k, T(1), w, p.k, b, ldb, bias ? T(1) : T(0), ys, p.hw);
    } else {
      T* buf = out.get() + worker * g.o * p.nb * p.hw;
      gemm<T>(false, false, g.o, ld, p.k, T(1), w, p.k, b, ldb, T(0), buf, ld);
      unpack_channels(buf, bias, c.nb, g.o, p.hw, y + c.n0 * out_sample);
    }
  });
}

// gx from gy. For stride 1 the input gradient is itself a convolution: gy, padded by
// d*(k-1) - p, correlated with the weights transposed to [c, o] and flipped in space. That runs
// through the forward path (im2col + a GEMM with k = o*kh*kw) instead of a GEMM with k = o
// followed by col2im's scattered adds. Strided convolutions take the GEMM + col2im route.
template <class T>
void conv2d_input_grad(const Conv2dGeometry& g, const T* w, const T* gy, T* gx) {
  if (g.sh == 1 && g.sw == 1 && g.ph <= g.dh * (g.kh - 1) && g.pw <= g.dw * (g.kw - 1)) {
    Conv2dGeometry gt = g;
    gt.c = g.o, gt.h = g.ho, gt.w = g.wo, gt.o = g.c, gt.ho = g.h, gt.wo = g.w;
    gt.ph = g.dh * (g.kh - 1) - g.ph, gt.pw = g.dw * (g.kw - 1) - g.pw;
    const int64_t taps = g.kh * g.kw;
    auto flipped = scratch<T>(g.o * g.c * taps);
    // Blocks of 16 input channels: contiguous reads, 16 contiguous write streams (512x512x3x3
    // weights are large enough for a plain transpose to cost a visible share of the backward).
    parallel_for(0, ceil_div(g.c, 16), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t block = lo; block < hi; ++block) {
        for (int64_t oc = 0; oc < g.o; ++oc) {
          for (int64_t ci = block * 16; ci < std::min(g.c, block * 16 + 16); ++ci) {
            const T* src = w + (oc * g.c + ci) * taps;
            T* dst = flipped.get() + (ci * g.o + oc) * taps;
            for (int64_t i = 0; i < taps; ++i) dst[i] = src[taps - 1 - i];
          }
        }
      }
    });
    conv2d_forward(gt, gy, flipped.get(), static_cast<const T*>(nullptr), gx);
    return;
  }
  const Plan p = make_plan(g, int64_t(sizeof(T)), false);
  const int64_t out_sample = g.o * p.hw, dcols_size = p.k * p.nb * p.hw;
  auto dcols = scratch<T>(p.workers * dcols_size);
  auto gy_packed = scratch<T>(p.nb == 1 ? 0 : p.workers * g.o * p.nb * p.hw);
  for_each_chunk(g, p, [&](int64_t worker, const Chunk& c) {
    const int64_t ld = c.nb * p.hw;
    const T* gys = gy + c.n0 * out_sample;
    if (c.nb != 1) {
      T* buf = gy_packed.get() + worker * g.o * p.nb * p.hw;
      pack_channels(gys, c.nb, g.o, p.hw, buf);
      gys = buf;
    }
    // dcols [k, ld] = w^T [k, o] * gy [o, ld], then added onto the input pixels they came from.
    T* d = dcols.get() + worker * dcols_size;
    gemm<T>(true, false, p.k, ld, g.o, T(1), w, p.k, gys, ld, T(0), d, ld);
    col2im(g, c, d, gx + c.n0 * g.c * g.h * g.w);
  });
}

// gw [o, k] = the sum over chunks of gy [o, columns] * cols^T [columns, k]. Worker 0
// accumulates into gw itself, the others into partial sums added at the end (every worker has
// at least one chunk: workers <= chunks).
template <class T>
void conv2d_weight_grad(const Conv2dGeometry& g, const T* x, const T* gy, T* gw) {
  if (use_taps(g)) {
    conv2d_weight_grad_taps(g, x, gy, gw);
    return;
  }
  const Plan p = make_plan(g, int64_t(sizeof(T)), true);
  const int64_t batch_cols = g.n * p.hw;
  if (p.blocks == 1 && p.chunks > 1 && !p.in_place() &&
      p.k * batch_cols * int64_t(sizeof(T)) <= kWholeBatchColumnBytes) {
    auto cols = scratch<T>(p.k * batch_cols);
    auto gy_packed = scratch<T>(g.o * batch_cols);
    im2col(g, Chunk{0, g.n, 0, g.ho}, x, cols.get());
    pack_channels(gy, g.n, g.o, p.hw, gy_packed.get());
    // gw rows [r0, r1) = gy rows [r0, r1) * cols^T; every row is one thread's, so the sums run in
    // the same order on every run.
    const int64_t parts = std::min<int64_t>(num_threads(), g.o);
    SingleThreadedBlas single;
    parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t part = lo; part < hi; ++part) {
        const int64_t r0 = g.o * part / parts, r1 = g.o * (part + 1) / parts;
        gemm<T>(false, true, r1 - r0, p.k, batch_cols, T(1), gy_packed.get() + r0 * batch_cols,
                batch_cols, cols.get(), batch_cols, T(0), gw + r0 * p.k, p.k);
      }
    });
    return;
  }
  const int64_t out_sample = g.o * p.hw, w_size = g.o * p.k;
  auto cols = scratch<T>(p.workers * p.cols_size(g));
  auto gy_packed = scratch<T>(p.nb == 1 ? 0 : p.workers * g.o * p.nb * p.hw);
  auto partial = scratch<T>((p.workers - 1) * w_size);
  std::vector<char> started(size_t(p.workers), 0);
  for_each_chunk(g, p, [&](int64_t worker, const Chunk& c) {
    const int64_t ld = c.nb * c.rows() * g.wo;
    const T* a = gy + c.n0 * out_sample + c.oh0 * g.wo;
    int64_t lda = p.hw;
    if (c.nb != 1) {
      T* buf = gy_packed.get() + worker * g.o * p.nb * p.hw;
      pack_channels(a, c.nb, g.o, p.hw, buf);
      a = buf;
      lda = ld;
    }
    const auto [b, ldb] = columns(g, p, c, x, cols.get() + worker * p.cols_size(g));
    T* acc = worker == 0 ? gw : partial.get() + (worker - 1) * w_size;
    const T beta = started[size_t(worker)] ? T(1) : T(0);
    started[size_t(worker)] = 1;
    gemm<T>(false, true, g.o, p.k, ld, T(1), a, lda, b, ldb, beta, acc, p.k);
  });
  if (p.workers > 1) {
    parallel_for(0, w_size, 1 << 14, [&](int64_t lo, int64_t hi) {
      for (int64_t wk = 1; wk < p.workers; ++wk) {
        const T* part = partial.get() + (wk - 1) * w_size;
        for (int64_t i = lo; i < hi; ++i) gw[i] += part[i];
      }
    });
  }
}

// gb[oc] = gy summed over the batch and the pixels, in f64 (the contract in kernels/conv2d.h).
// Each channel's terms go to kBiasLanes partial sums by pixel index modulo kBiasLanes (sample by
// sample, pixel by pixel), added pairwise at the end: independent chains the compiler vectorizes
// (one chain cost an add's latency per element: 5% of a ToyNet step), in an order both layouts
// keep, so that channels last gives the same bits.
constexpr int64_t kBiasLanes = 8;

double sum_bias_lanes(const double* a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

template <class T>
void conv2d_bias_grad(const Conv2dGeometry& g, const T* gy, T* gb) {
  const int64_t hw = g.ho * g.wo;
  parallel_for(0, g.o, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t oc = lo; oc < hi; ++oc) {
      double acc[kBiasLanes] = {};
      for (int64_t s = 0; s < g.n; ++s) {
        const T* r = gy + (s * g.o + oc) * hw;
        int64_t i = 0;
        for (; i + kBiasLanes <= hw; i += kBiasLanes)
          for (int64_t j = 0; j < kBiasLanes; ++j) acc[j] += double(r[i + j]);
        for (int64_t j = 0; i + j < hw; ++j) acc[j] += double(r[i + j]);
      }
      gb[oc] = T(sum_bias_lanes(acc));
    }
  });
}

// The same sums for channels-last gy ([n, ho, wo, o]): each channel's terms in the same lanes and
// order, so the same bits as conv2d_bias_grad on the NCHW copy.
template <class T>
void conv2d_bias_grad_channels_last(const Conv2dGeometry& g, const T* gy, T* gb) {
  const int64_t hw = g.ho * g.wo;
  parallel_for(0, g.o, 64, [&](int64_t lo, int64_t hi) {
    const int64_t width = hi - lo;
    std::vector<double> acc(size_t(kBiasLanes * width), 0.0);  // [lane][channel]
    for (int64_t s = 0; s < g.n; ++s) {
      for (int64_t i = 0; i < hw; ++i) {
        const T* row = gy + (s * hw + i) * g.o + lo;
        double* a = acc.data() + (i % kBiasLanes) * width;
        for (int64_t c = 0; c < width; ++c) a[c] += double(row[c]);
      }
    }
    for (int64_t c = 0; c < width; ++c) {
      double lanes[kBiasLanes];
      for (int64_t j = 0; j < kBiasLanes; ++j) lanes[j] = acc[size_t(j * width + c)];
      gb[lo + c] = T(sum_bias_lanes(lanes));
    }
  });
}

// Our Winograd convolution takes the layers it applies to unless oneDNN runs them with its own
// Winograd (AVX-512 machines): where oneDNN would run a direct convolution (AVX2 and older, or
// oneDNN switched off), ours is faster (docs/architecture.md, "CPU convolutions").
bool use_own_winograd(const Conv2dGeometry& g) {
  return winograd_enabled() && winograd_applies(g) && !onednn_runs_winograd(g);
}

template <class T>
void conv2d_backward(const Conv2dGeometry& g, const T* x, const T* w, const T* gy, T* gx, T* gw,
                     T* gb) {
  if (gb) conv2d_bias_grad(g, gy, gb);
  if constexpr (std::is_same_v<T, float>) {
    if (use_own_winograd(g)) {
      if (gx) winograd_conv2d_input_grad(g, w, gy, gx);
      if (gw) winograd_conv2d_weight_grad(g, x, gy, gw);
      return;
    }
    if (onednn_conv2d_backward(g, x, w, gy, gx, gw)) return;
  }
  if (g.n == 0) {
    if (gw) std::fill_n(gw, g.o * g.c * g.kh * g.kw, T(0));
    return;
  }
  if (gx) conv2d_input_grad(g, w, gy, gx);
  if (gw) conv2d_weight_grad(g, x, gy, gw);
}

// [n, hw, c] (channels last) -> [n, c, hw] by ShapeCopy's (tiled, parallel) transpose; nothing
// for a null array.
template <class T>
std::vector<T> to_channels_first(const T* p, int64_t n, int64_t c, int64_t hw, Ctx ctx) {
  std::vector<T> out;
  if (p == nullptr) return out;
  out.resize(size_t(n * c * hw));
  const StridedCopy l{3, {n, c, hw}, {hw * c, 1, c}, {c * hw, hw, 1}};
  ShapeCopy<Cpu>::strided_copy(p, out.data(), kernels::detail::coalesce(l), ctx);
  return out;
}

// [n, c, hw] -> [n, hw, c] into dst (when not null).
template <class T>
void to_channels_last(const std::vector<T>& src, T* dst, int64_t n, int64_t c, int64_t hw,
                      Ctx ctx) {
  if (dst == nullptr) return;
  const StridedCopy l{3, {n, c, hw}, {c * hw, hw, 1}, {hw * c, 1, c}};
  ShapeCopy<Cpu>::strided_copy(src.data(), dst, kernels::detail::coalesce(l), ctx);
}

// A scratch array for `want` (null when not wanted), its size that of n * c * hw values.
template <class T>
std::vector<T> scratch_for(const T* want, int64_t n, int64_t c, int64_t hw) {
  return want == nullptr ? std::vector<T>() : std::vector<T>(size_t(n * c * hw));
}

}  // namespace
}  // namespace rg::kernels::cpu

namespace rg::kernels {

template <>
template <class T>
int64_t Conv2d<Cpu>::workspace_bytes(const Conv2dGeometry&, ConvPass, bool, Ctx) {
  return 0;  // the CPU convolution allocates its own scratch
}

template <>
template <class T>
void Conv2d<Cpu>::forward(const Conv2dGeometry& g, const T* x, const T* w, const T* bias, T* y,
                          bool allow_tf32, Workspace workspace, Ctx ctx) {
  if (g.channels_last) {
    if constexpr (std::is_same_v<T, float>) {  // our Winograd or oneDNN, on our NHWC arrays
      if (cpu::use_own_winograd(g)) {
        cpu::winograd_conv2d_forward(g, x, w, bias, y);
        return;
      }
      if (cpu::onednn_conv2d_forward(g, x, w, bias, y)) return;
    }
    // Otherwise converted at the boundary: the convolutions below are NCHW.
    Conv2dGeometry f = g;
    f.channels_last = false;
    const std::vector<T> xs = cpu::to_channels_first(x, g.n, g.c, g.h * g.w, ctx),
                         ws = cpu::to_channels_first(w, g.o, g.c, g.kh * g.kw, ctx);
    std::vector<T> ys(size_t(g.n * g.o * g.ho * g.wo));
    forward<T>(f, xs.data(), ws.data(), bias, ys.data(), allow_tf32, workspace, ctx);
    cpu::to_channels_last(ys, y, g.n, g.o, g.ho * g.wo, ctx);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (cpu::use_own_winograd(g)) {
      cpu::winograd_conv2d_forward(g, x, w, bias, y);
      return;
    }
    if (cpu::onednn_conv2d_forward(g, x, w, bias, y)) return;
  }
  cpu::conv2d_forward(g, x, w, bias, y);
}

template <>
template <class T>
void Conv2d<Cpu>::backward(const Conv2dGeometry& g, const T* x, const T* w, const T* gy, T* gx,
                           T* gw, T* gb, bool, Workspace, Ctx ctx) {
  if (g.channels_last) {
    if constexpr (std::is_same_v<T, float>) {
      const bool own = cpu::use_own_winograd(g);
      if (own) {
        if (gx) cpu::winograd_conv2d_input_grad(g, w, gy, gx);
        if (gw) cpu::winograd_conv2d_weight_grad(g, x, gy, gw);
      }
      if (own || cpu::onednn_conv2d_backward(g, x, w, gy, gx, gw)) {
        if (gb) cpu::conv2d_bias_grad_channels_last(g, gy, gb);
        return;
      }
    }
    Conv2dGeometry f = g;
    f.channels_last = false;
    const int64_t hw = g.h * g.w, k = g.kh * g.kw, hwo = g.ho * g.wo;
    const std::vector<T> xs = cpu::to_channels_first(x, g.n, g.c, hw, ctx),
                         ws = cpu::to_channels_first(w, g.o, g.c, k, ctx),
                         gys = cpu::to_channels_first(gy, g.n, g.o, hwo, ctx);
    std::vector<T> gxs = cpu::scratch_for(gx, g.n, g.c, hw);
    std::vector<T> gws = cpu::scratch_for(gw, g.o, g.c, k);
    cpu::conv2d_backward(f, x ? xs.data() : nullptr, w ? ws.data() : nullptr, gys.data(),
                         gx ? gxs.data() : nullptr, gw ? gws.data() : nullptr, gb);
    cpu::to_channels_last(gxs, gx, g.n, g.c, hw, ctx);
    cpu::to_channels_last(gws, gw, g.o, g.c, k, ctx);
    return;
  }
  cpu::conv2d_backward(g, x, w, gy, gx, gw, gb);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_conv2d_kernels() {
  using K = Conv2d<Cpu>;
  return std::tuple{&K::workspace_bytes<T>, &K::forward<T>, &K::backward<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_conv2d_kernels)

}  // namespace rg::kernels
