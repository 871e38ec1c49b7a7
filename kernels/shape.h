// The shape kernels, one contract for both backends (kernels/backend.h): an N-d strided copy, the
// one kernel behind permute and narrow_copy (forward and backward). kernels/cpu/shape.cpp defines
// ShapeCopy<Cpu> (f32, f64, i64), kernels/cuda/shape.cu ShapeCopy<Cuda> (f32, f64, f16, bf16,
// i64); every pointer is on the backend's device.
//
// A StridedCopy walks the elements of a `sizes` box in row-major order; element (i_0, ..., i_k)
// is read at src[sum i_j * src_strides[j]] and written at dst[sum i_j * dst_strides[j]] (strides
// in elements). No two elements of the box may share a destination. The engine builds the layout
// (engine/ops/shape.cpp) and coalesces it first (coalesce below), so a permute of [B, T, H, D]
// that keeps D copies runs of D contiguous elements.
#pragma once

#include <cstdint>
#include <tuple>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

inline constexpr int kMaxCopyDims = 8;

struct StridedCopy {
  int ndim = 0;
  int64_t sizes[kMaxCopyDims] = {};
  int64_t src_strides[kMaxCopyDims] = {};
  int64_t dst_strides[kMaxCopyDims] = {};
};

template <class B>
struct ShapeCopy {
  // dst[layout.dst offsets] = src[layout.src offsets] over the layout's box.
  template <class T>
  static void strided_copy(const T* src, T* dst, const StridedCopy& layout, Ctx ctx);
};

// Instantiates ShapeCopy<B> for a backend's float LIST (kernels/backend.h) and i64, through
// `template <class T> auto fn()` (RG_INSTANTIATE's rules: fn unique to its file, not in an unnamed
// namespace).
#define RG_INSTANTIATE_SHAPE_COPY(B, LIST, fn)         \
  template <class T>                                   \
  auto fn() {                                          \
    return std::tuple{&ShapeCopy<B>::strided_copy<T>}; \
  }                                                    \
  RG_INSTANTIATE(LIST, fn)                             \
  RG_INSTANTIATE_ONE_(fn, int64_t)

namespace detail {

inline int64_t copy_numel(const StridedCopy& l) {
  int64_t n = 1;
  for (int k = 0; k < l.ndim; ++k) n *= l.sizes[k];
  return n;
}

// The checks both backends make before touching memory.
inline void check_strided_copy(const StridedCopy& l) {
  RG_CHECK(l.ndim >= 0 && l.ndim <= kMaxCopyDims, "strided_copy: ", l.ndim,
           " dimensions, expected at most ", kMaxCopyDims);
  for (int k = 0; k < l.ndim; ++k)
    RG_CHECK(l.sizes[k] >= 0, "strided_copy: size ", l.sizes[k], " of dimension ", k,
             " is negative");
}

// The same copy with size-1 dimensions dropped and neighbours merged where both strides allow it
// (dimension k and k+1 merge when stride[k] == stride[k+1] * size[k+1] for src and dst).
inline StridedCopy coalesce(const StridedCopy& l) {
  StridedCopy c;
  for (int k = 0; k < l.ndim; ++k) {
    if (l.sizes[k] == 1) continue;
    if (c.ndim > 0) {
      const int j = c.ndim - 1;
      if (c.src_strides[j] == l.src_strides[k] * l.sizes[k] &&
          c.dst_strides[j] == l.dst_strides[k] * l.sizes[k]) {
        c.sizes[j] *= l.sizes[k];
        c.src_strides[j] = l.src_strides[k];
        c.dst_strides[j] = l.dst_strides[k];
        continue;
      }
    }
    c.sizes[c.ndim] = l.sizes[k];
    c.src_strides[c.ndim] = l.src_strides[k];
    c.dst_strides[c.ndim] = l.dst_strides[k];
    ++c.ndim;
  }
  return c;
}

}  // namespace detail
}  // namespace rg::kernels
