// The shape kernels on CUDA (kernels/shape.h). The strided copy gives each thread one element of
// the box at a time (grid-stride, int64 indices): it splits the linear index over the coalesced
// sizes and reads and writes at the two offsets. Pure data movement, so f16/bf16 are copied as
// they are.
#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"
#include "kernels/shape.h"

namespace rg::kernels {
namespace {

using cuda::detail::as_stream;
using cuda::detail::blocks_for;
using cuda::detail::dev;
using cuda::detail::device_t;
using cuda::detail::grid_start;
using cuda::detail::grid_stride;
using cuda::detail::kThreads;
using cuda::detail::unravel;

template <class D>
__global__ void strided_copy_kernel(const D* src, D* dst, StridedCopy layout, int64_t n) {
  for (int64_t e = grid_start(); e < n; e += grid_stride()) {
    const auto [s, d] =
        unravel(e, layout.ndim, layout.sizes, layout.src_strides, layout.dst_strides);
    dst[d] = src[s];
  }
}

}  // namespace

template <>
template <class T>
void ShapeCopy<Cuda>::strided_copy(const T* src, T* dst, const StridedCopy& layout, Ctx ctx) {
  using D = device_t<T>;
  detail::check_strided_copy(layout);
  const int64_t n = detail::copy_numel(layout);
  if (n == 0) return;
  RG_LAUNCH(strided_copy_kernel<D>, blocks_for(n), kThreads, 0, as_stream(ctx.stream), dev(src),
            dev(dst), layout, n);
}

RG_INSTANTIATE_SHAPE_COPY(Cuda, RG_CUDA_FLOAT_TYPES, cuda_shape_kernels)

}  // namespace rg::kernels
