// Bucket pack/unpack: every block walks the slice table and covers each slice with a grid-stride
// loop, so one launch handles any mix of large and small gradients without a per-element search.
#include "kernels/cuda/bucket.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"

namespace rg::kernels::cuda {
namespace {

using namespace detail;

// kPack: bucket <- slices, else slices <- bucket; kScale: multiply (else copy the bits).
template <bool kPack, bool kScale, class D>
__global__ void bucket_copy_kernel(const BucketSlice* slices, int64_t num_slices, D* bucket,
                                   compute_t<D> scale) {
  for (int64_t s = 0; s < num_slices; ++s) {
    const BucketSlice slice = slices[s];
    D* data = static_cast<D*>(slice.data);
    D* flat = bucket + slice.offset;
    for (int64_t i = grid_start(); i < slice.count; i += grid_stride()) {
      const D src = kPack ? data[i] : flat[i];
      const D dst = kScale ? store<D>(load(src) * scale) : src;
      if constexpr (kPack) {
        flat[i] = dst;
      } else {
        data[i] = dst;
      }
    }
  }
}

template <bool kPack, class T>
void bucket_copy(const char* name, const BucketSlice* slices, int64_t num_slices, T* bucket,
                 int64_t bucket_numel, double scale, void* stream) {
  RG_CHECK(num_slices >= 0 && bucket_numel >= 0, "cuda::", name,
           ": counts must be >= 0, got num_slices ", num_slices, ", bucket_numel ", bucket_numel);
  if (num_slices == 0 || bucket_numel == 0) return;
  RG_CHECK(slices != nullptr && bucket != nullptr, "cuda::", name, ": null slice table or bucket");
  using D = device_t<T>;
  const auto s = static_cast<compute_t<D>>(scale);
  if (scale == 1.0) {
    RG_LAUNCH((bucket_copy_kernel<kPack, false, D>), blocks_for(bucket_numel), kThreads, 0,
              as_stream(stream), slices, num_slices, dev(bucket), s);
  } else {
    RG_LAUNCH((bucket_copy_kernel<kPack, true, D>), blocks_for(bucket_numel), kThreads, 0,
              as_stream(stream), slices, num_slices, dev(bucket), s);
  }
}

}  // namespace

template <class T>
void bucket_pack(const BucketSlice* slices, int64_t num_slices, T* bucket, int64_t bucket_numel,
                 double scale, void* stream) {
  bucket_copy<true>("bucket_pack", slices, num_slices, bucket, bucket_numel, scale, stream);
}

template <class T>
void bucket_unpack(const BucketSlice* slices, int64_t num_slices, const T* bucket,
                   int64_t bucket_numel, double scale, void* stream) {
  // The kernel only reads the bucket when unpacking.
  bucket_copy<false>("bucket_unpack", slices, num_slices, const_cast<T*>(bucket), bucket_numel,
                     scale, stream);
}

#define RG_INSTANTIATE(T)                                                                \
  template void bucket_pack<T>(const BucketSlice*, int64_t, T*, int64_t, double, void*); \
  template void bucket_unpack<T>(const BucketSlice*, int64_t, const T*, int64_t, double, void*);
RG_INSTANTIATE(float)
RG_INSTANTIATE(double)
RG_INSTANTIATE(Half)
RG_INSTANTIATE(BFloat16)
#undef RG_INSTANTIATE

}  // namespace rg::kernels::cuda
