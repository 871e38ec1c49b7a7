// kernels/cuda/bucket.cu under the CUDA emulator: DDP bucket pack (scaled by 1/world_size) and
// unpack in one launch per list, against the obvious loop (there is no CPU kernel: the CPU
// Reducer copies tensor by tensor), bit for bit, with gaps between slices left untouched.
#include "kernels/cuda/bucket.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "emu/kernels/reference_util.h"
#include "kernels/cpu/cast.h"
#include "kernels/error.h"

namespace rg::emu_kernel_test {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

// Gradients of the given sizes laid out in reverse order (as DDP fills buckets) with a gap of
// `gap` elements before each, in a bucket of sentinel values.
template <class T>
struct Layout {
  std::vector<std::vector<T>> grads;
  std::vector<cuda::BucketSlice> slices;
  int64_t numel = 0;
};

template <class T>
Layout<T> make_layout(const std::vector<int64_t>& sizes, int64_t gap, uint64_t seed) {
  Layout<T> l;
  l.grads.reserve(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    l.grads.push_back(random_values<T>(sizes[k], seed + k, -3.f, 3.f));
  }
  for (size_t k = sizes.size(); k-- > 0;) {
    l.numel += gap;
    l.slices.push_back({l.grads[k].data(), l.numel, sizes[k]});
    l.numel += sizes[k];
  }
  return l;
}

template <class T>
T scaled(T x, double scale) {
  return cpu::convert<T>(cpu::convert<ref_t<T>>(x) * static_cast<ref_t<T>>(scale));
}

template <class T>
void check_pack_unpack(const std::vector<int64_t>& sizes, int64_t gap, double scale,
                       const std::string& what) {
  auto l = make_layout<T>(sizes, gap, sizes.size());
  const T sentinel = cpu::convert<T>(1234.f);
  std::vector<T> bucket(static_cast<size_t>(l.numel), sentinel);
  cuda::bucket_pack(l.slices.data(), int64_t(l.slices.size()), bucket.data(), l.numel, scale,
                    nullptr);
  std::vector<T> want(static_cast<size_t>(l.numel), sentinel);
  for (const auto& s : l.slices) {
    const T* g = static_cast<const T*>(s.data);
    for (int64_t i = 0; i < s.count; ++i) want[size_t(s.offset + i)] = scaled(g[i], scale);
  }
  expect_bits_equal(bucket, want, what + " pack");

  // Unpack a different bucket into the same gradients.
  const auto source = random_values<T>(l.numel, 99, -3.f, 3.f);
  cuda::bucket_unpack(l.slices.data(), int64_t(l.slices.size()), source.data(), l.numel, scale,
                      nullptr);
  for (size_t k = 0; k < l.slices.size(); ++k) {
    const auto& s = l.slices[k];
    std::vector<T> got(static_cast<const T*>(s.data), static_cast<const T*>(s.data) + s.count);
    std::vector<T> expected(static_cast<size_t>(s.count));
    for (int64_t i = 0; i < s.count; ++i) {
      expected[size_t(i)] = scaled(source[size_t(s.offset + i)], scale);
    }
    expect_bits_equal(got, expected, what + " unpack slice " + std::to_string(k));
  }
}

TEST(EmuBucket, PackUnpackMatchReference) {
  for_each_float_type([]<class T>() {
    for (const double scale : {1.0, 1.0 / 3.0, 0.25}) {
      const std::string tag = " scale " + std::to_string(scale);
      // The awkward sizes together, one at a time, with and without gaps.
      check_pack_unpack<T>(kAwkwardSizes, 0, scale, "awkward sizes" + tag);
      check_pack_unpack<T>(kAwkwardSizes, 7, scale, "awkward sizes, gaps" + tag);
      for (const int64_t n : kAwkwardSizes) {
        check_pack_unpack<T>({n}, 3, scale, "one slice n=" + std::to_string(n) + tag);
      }
    }
  });
}

TEST(EmuBucket, ManySmallSlicesInOneLaunch) {
  // A bucket of 300 biases-like gradients of 1..5 elements and a few large ones.
  std::vector<int64_t> sizes;
  for (int k = 0; k < 300; ++k) sizes.push_back(1 + k % 5);
  sizes.push_back(4097);
  sizes.push_back(513);
  for_each_float_type([&]<class T>() { check_pack_unpack<T>(sizes, 1, 0.5, "300 small slices"); });
}

TEST(EmuBucket, SliceLargerThanTheGrid) {
  // One slice longer than kMaxBlocks (4095) blocks of 256 threads: each thread loops within the
  // slice.
  check_pack_unpack<float>({5, 4096 * 256 + 33, 7}, 2, 0.5, "large slice");
}

TEST(EmuBucket, CopyWithoutScaleKeepsBits) {
  // scale == 1 copies: NaN payloads and signed zeros pass unchanged.
  std::vector<float> g = {NAN, -0.f, INFINITY, 1.f};
  g[0] = std::bit_cast<float>(0x7fc01234u);
  std::vector<cuda::BucketSlice> slices = {{g.data(), 0, 4}};
  std::vector<float> bucket(4, 0.f);
  cuda::bucket_pack(slices.data(), 1, bucket.data(), 4, 1.0, nullptr);
  expect_bits_equal(bucket, g, "pack scale 1");
}

TEST(EmuBucket, EmptyListsDoNothingAndBadCountsThrow) {
  std::vector<float> bucket = {42.f};
  std::vector<cuda::BucketSlice> slices = {{bucket.data(), 0, 0}};
  cuda::bucket_pack(slices.data(), 0, bucket.data(), 1, 0.5, nullptr);
  cuda::bucket_pack(slices.data(), 1, bucket.data(), 1, 0.5, nullptr);  // a zero-count slice
  cuda::bucket_unpack<float>(nullptr, 0, nullptr, 0, 0.5, nullptr);
  EXPECT_EQ(bucket[0], 42.f);
  EXPECT_THROW(cuda::bucket_pack(slices.data(), -1, bucket.data(), 1, 0.5, nullptr), rg::Error);
  EXPECT_THROW(cuda::bucket_pack(slices.data(), 1, bucket.data(), -1, 0.5, nullptr), rg::Error);
}

}  // namespace
}  // namespace rg::emu_kernel_test
