// The shape kernels on the CPU (kernels/shape.h). The strided copy runs over the rows of its box
// (every dimension but the last) in parallel, copying each row with memcpy when the last
// dimension is contiguous on both sides and element by element otherwise; a transpose of the last
// two dimensions (contiguous along one on each side: NCHW <-> NHWC, a matrix transpose) goes by
// 32 x 32 tiles, so that both sides are read and written a cache line at a time.
#include "kernels/shape.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {
constexpr int64_t kGrain = 1 << 14;  // elements per parallel chunk
constexpr int64_t kTile = 32;        // a transpose's tile side

// Whether the last two dimensions of l are a transpose: the last contiguous on one side and the
// one before it on the other.
bool is_transpose(const StridedCopy& l) {
  if (l.ndim < 2) return false;
  const int a = l.ndim - 2, b = l.ndim - 1;
  return (l.src_strides[b] == 1 && l.dst_strides[a] == 1 && l.dst_strides[b] != 1) ||
         (l.dst_strides[b] == 1 && l.src_strides[a] == 1 && l.src_strides[b] != 1);
}

// The copy of a transpose layout (is_transpose): the outer dimensions' matrices by tiles, in
// parallel over (matrix, band of kTile rows) pairs, so one matrix alone still spreads.
template <class T>
void transpose_copy(const T* src, T* dst, const StridedCopy& l, int threads) {
  const int a = l.ndim - 2, b = l.ndim - 1;
  const int64_t rows = l.sizes[a], cols = l.sizes[b];
  const int64_t ssa = l.src_strides[a], ssb = l.src_strides[b], dsa = l.dst_strides[a],
                dsb = l.dst_strides[b];
  const int64_t matrices = detail::copy_numel(l) / (rows * cols);
  const int64_t bands = (rows + kTile - 1) / kTile;
  cpu::parallel_for(
      0, matrices * bands, std::max<int64_t>(1, kGrain / (kTile * cols)),
      [&](int64_t lo, int64_t hi) {
        for (int64_t job = lo; job < hi; ++job) {
          const int64_t m = job / bands, r0 = job % bands * kTile;
          const int64_t r1 = std::min(rows, r0 + kTile);
          int64_t src_off = 0, dst_off = 0;
          for (int64_t k = a - 1, rest = m; k >= 0; --k) {
            const int64_t i = rest % l.sizes[k];
            rest /= l.sizes[k];
            src_off += i * l.src_strides[k];
            dst_off += i * l.dst_strides[k];
          }
          for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
            const int64_t c1 = std::min(cols, c0 + kTile);
            for (int64_t r = r0; r < r1; ++r)
              for (int64_t c = c0; c < c1; ++c)
                dst[dst_off + r * dsa + c * dsb] = src[src_off + r * ssa + c * ssb];
          }
        }
      },
      threads);
}

}  // namespace

template <>
template <class T>
void ShapeCopy<Cpu>::strided_copy(const T* src, T* dst, const StridedCopy& layout, Ctx ctx) {
  detail::check_strided_copy(layout);
  const int64_t n = detail::copy_numel(layout);
  if (n == 0) return;
  if (layout.ndim == 0) {
    *dst = *src;
    return;
  }
  if (is_transpose(layout)) {
    transpose_copy(src, dst, layout, ctx.threads);
    return;
  }
  const int last = layout.ndim - 1;
  const int64_t run = layout.sizes[last], ss = layout.src_strides[last],
                ds = layout.dst_strides[last];
  const bool contiguous = ss == 1 && ds == 1;
  cpu::parallel_for(
      0, n / run, std::max<int64_t>(1, kGrain / run),
      [&](int64_t lo, int64_t hi) {
        // The odometer of row lo over dimensions [0, last), and its offsets.
        int64_t idx[kMaxCopyDims] = {};
        int64_t src_off = 0, dst_off = 0;
        for (int64_t k = last - 1, rest = lo; k >= 0; --k) {
          idx[k] = rest % layout.sizes[k];
          rest /= layout.sizes[k];
          src_off += idx[k] * layout.src_strides[k];
          dst_off += idx[k] * layout.dst_strides[k];
        }
        for (int64_t r = lo; r < hi; ++r) {
          if (contiguous) {
            std::memcpy(dst + dst_off, src + src_off, static_cast<size_t>(run) * sizeof(T));
          } else {
            for (int64_t i = 0; i < run; ++i) dst[dst_off + i * ds] = src[src_off + i * ss];
          }
          for (int k = last - 1; k >= 0; --k) {
            src_off += layout.src_strides[k];
            dst_off += layout.dst_strides[k];
            if (++idx[k] < layout.sizes[k]) break;
            src_off -= idx[k] * layout.src_strides[k];
            dst_off -= idx[k] * layout.dst_strides[k];
            idx[k] = 0;
          }
        }
      },
      ctx.threads);
}

RG_INSTANTIATE_SHAPE_COPY(Cpu, RG_CPU_FLOAT_TYPES, cpu_shape_kernels)

}  // namespace rg::kernels
