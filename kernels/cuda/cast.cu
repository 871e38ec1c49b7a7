// Fill and cast kernels: grid-stride loops; a cast loads in the compute type (f32 for f16/bf16,
// exact) and stores with one rounding (or C++'s truncation toward zero into an integer type), so
// the result is the CPU's bit for bit.
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/cuda/cast.h"
#include "kernels/error.h"

namespace rg::kernels::cuda {
namespace {

using namespace detail;

template <class D>
__global__ void fill_kernel(D* out, D value, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) out[i] = value;
}

template <class From, class To>
__global__ void cast_kernel(const From* src, To* dst, int64_t n) {
  // Also for From == To, like the CPU: a f16/bf16 NaN comes back quiet, its payload dropped.
  for (int64_t i = grid_start(); i < n; i += grid_stride()) dst[i] = store<To>(load(src[i]));
}

}  // namespace

template <class T>
void fill(T* out, T value, int64_t n, void* stream) {
  RG_CHECK(n >= 0, "cuda::fill: element count must be >= 0, got ", n);
  if (n == 0) return;
  using D = device_t<T>;
  RG_LAUNCH(fill_kernel<D>, blocks_for(n), kThreads, 0, as_stream(stream), dev(out),
            to_device(value), n);
}

template <class From, class To>
void cast(const From* src, To* dst, int64_t n, void* stream) {
  RG_CHECK(n >= 0, "cuda::cast: element count must be >= 0, got ", n);
  if (n == 0) return;
  RG_LAUNCH((cast_kernel<device_t<From>, device_t<To>>), blocks_for(n), kThreads, 0,
            as_stream(stream), dev(src), dev(dst), n);
}

template void fill<float>(float*, float, int64_t, void*);
template void fill<double>(double*, double, int64_t, void*);
template void fill<Half>(Half*, Half, int64_t, void*);
template void fill<BFloat16>(BFloat16*, BFloat16, int64_t, void*);
template void fill<int64_t>(int64_t*, int64_t, int64_t, void*);
template void fill<int32_t>(int32_t*, int32_t, int64_t, void*);
template void fill<uint8_t>(uint8_t*, uint8_t, int64_t, void*);

#define RG_CAST_TO(FROM)                                                      \
  template void cast<FROM, float>(const FROM*, float*, int64_t, void*);       \
  template void cast<FROM, double>(const FROM*, double*, int64_t, void*);     \
  template void cast<FROM, Half>(const FROM*, Half*, int64_t, void*);         \
  template void cast<FROM, BFloat16>(const FROM*, BFloat16*, int64_t, void*); \
  template void cast<FROM, int64_t>(const FROM*, int64_t*, int64_t, void*);   \
  template void cast<FROM, int32_t>(const FROM*, int32_t*, int64_t, void*);   \
  template void cast<FROM, uint8_t>(const FROM*, uint8_t*, int64_t, void*);
RG_CAST_TO(float)
RG_CAST_TO(double)
RG_CAST_TO(Half)
RG_CAST_TO(BFloat16)
RG_CAST_TO(int64_t)
RG_CAST_TO(int32_t)
RG_CAST_TO(uint8_t)
#undef RG_CAST_TO

}  // namespace rg::kernels::cuda
