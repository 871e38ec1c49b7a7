// CUDA pack/unpack of DDP gradient buckets: many gradients copied into (or out of) one flat bucket
// in a single launch, scaled on the way in (by 1/world_size). Plain C++ header: `stream` is a
// cudaStream_t.
#pragma once

#include <cstdint>

namespace rg::kernels::cuda {

// One gradient's place in a bucket: `count` elements at `data` (device memory) are elements
// [offset, offset + count) of the bucket. Slices must not overlap in the bucket.
struct BucketSlice {
  void* data;
  int64_t offset;
  int64_t count;
};

// Instantiated for float, double, Half and BFloat16 (f16/bf16 scale in f32 and round once).
// `slices` is a DEVICE array of num_slices entries (the kernel reads it); bucket_numel is the
// bucket's element count (it sizes the grid; every slice must lie within it).

// bucket[s.offset + i] = s.data[i] * scale for every slice s (a plain copy when scale == 1).
template <class T>
void bucket_pack(const BucketSlice* slices, int64_t num_slices, T* bucket, int64_t bucket_numel,
                 double scale, void* stream);
// s.data[i] = bucket[s.offset + i] * scale for every slice s (a plain copy when scale == 1).
template <class T>
void bucket_unpack(const BucketSlice* slices, int64_t num_slices, const T* bucket,
                   int64_t bucket_numel, double scale, void* stream);

}  // namespace rg::kernels::cuda
