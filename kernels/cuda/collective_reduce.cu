// Collective reduction kernels: one grid-stride kernel per op (a template argument). The formulas
// are kernels/cpu/collective_reduce.cpp's, so a ring all-reduce gives the same bits on either side.
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/collective_reduce.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"

namespace rg::kernels::cuda {
namespace {

using namespace detail;

template <CollectiveOp Op, class D>
__global__ void collective_reduce_kernel(D* out, const D* a, const D* b, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const compute_t<D> x = load(a[i]), y = load(b[i]);
    if constexpr (Op == CollectiveOp::sum) {
      out[i] = store<D>(x + y);
    } else if constexpr (Op == CollectiveOp::max) {
      out[i] = store<D>(x < y ? y : x);  // std::max(x, y)
    } else {
      static_assert(Op == CollectiveOp::min);
      out[i] = store<D>(y < x ? y : x);  // std::min(x, y)
    }
  }
}

template <class D>
__global__ void divide_by_kernel(D* x, int64_t n, compute_t<D> divisor) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    x[i] = store<D>(load(x[i]) / divisor);
  }
}

}  // namespace

template <class T>
void collective_reduce(CollectiveOp op, T* out, const T* a, const T* b, int64_t n, void* stream) {
  RG_CHECK(n >= 0, "cuda::collective_reduce: element count must be >= 0, got ", n);
  if (n == 0) return;
  using D = device_t<T>;
  const unsigned int grid = blocks_for(n);
  switch (op) {
    case CollectiveOp::sum:
      RG_LAUNCH((collective_reduce_kernel<CollectiveOp::sum, D>), grid, kThreads, 0,
                as_stream(stream), dev(out), dev(a), dev(b), n);
      return;
    case CollectiveOp::max:
      RG_LAUNCH((collective_reduce_kernel<CollectiveOp::max, D>), grid, kThreads, 0,
                as_stream(stream), dev(out), dev(a), dev(b), n);
      return;
    case CollectiveOp::min:
      RG_LAUNCH((collective_reduce_kernel<CollectiveOp::min, D>), grid, kThreads, 0,
                as_stream(stream), dev(out), dev(a), dev(b), n);
      return;
  }
  RG_FAIL("cuda::collective_reduce: unknown CollectiveOp ", static_cast<int>(op));
}

template <class T>
void divide_by(T* x, int64_t n, int64_t divisor, void* stream) {
  RG_CHECK(n >= 0, "cuda::divide_by: element count must be >= 0, got ", n);
  RG_CHECK(divisor > 0, "cuda::divide_by: divisor must be > 0, got ", divisor);
  if (n == 0 || divisor == 1) return;
  using D = device_t<T>;
  RG_LAUNCH(divide_by_kernel<D>, blocks_for(n), kThreads, 0, as_stream(stream), dev(x), n,
            static_cast<compute_t<D>>(divisor));
}

#define RG_INSTANTIATE(T)                                                                   \
  template void collective_reduce<T>(CollectiveOp, T*, const T*, const T*, int64_t, void*); \
  template void divide_by<T>(T*, int64_t, int64_t, void*);
RG_INSTANTIATE(float)
RG_INSTANTIATE(double)
RG_INSTANTIATE(Half)
RG_INSTANTIATE(BFloat16)
RG_INSTANTIATE(int64_t)
RG_INSTANTIATE(int32_t)
RG_INSTANTIATE(uint8_t)
#undef RG_INSTANTIATE

}  // namespace rg::kernels::cuda
