// The shape kernels on the CPU (kernels/shape.h). The strided copy runs over the rows of its box
// (every dimension but the last) in parallel, copying each row with memcpy when the last
// dimension is contiguous on both sides and element by element otherwise.
#include "kernels/shape.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {
constexpr int64_t kGrain = 1 << 14;  // elements per parallel chunk
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
