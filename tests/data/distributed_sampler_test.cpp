// DistributedSampler against PyTorch's documented partition (padding by wrapping, drop_last,
// rank-strided split) and its shuffling contract (seed + epoch, identical on every rank).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "data/sampler.h"
#include "support/errors.h"

namespace rg::data {
namespace {

using V = std::vector<int64_t>;

V of(int64_t n, int r, int rank, bool drop_last, bool shuffle = false, int64_t epoch = 0) {
  DistributedSampler s(n, r, rank, shuffle, /*seed=*/5, drop_last);
  s.set_epoch(epoch);
  EXPECT_EQ(int64_t(s.indices().size()), s.size());
  return s.indices();
}

TEST(DistributedSamplerTest, PadsByWrappingWhenNotDivisible) {
  // torch: N=10, R=3 -> num_samples 4, indices [0..9, 0, 1], rank r takes [r::3].
  EXPECT_EQ(of(10, 3, 0, false), (V{0, 3, 6, 9}));
  EXPECT_EQ(of(10, 3, 1, false), (V{1, 4, 7, 0}));
  EXPECT_EQ(of(10, 3, 2, false), (V{2, 5, 8, 1}));
}

TEST(DistributedSamplerTest, DropLastTruncates) {
  // torch: N=10, R=3, drop_last -> num_samples ceil((10-3)/3) = 3, total 9.
  EXPECT_EQ(of(10, 3, 0, true), (V{0, 3, 6}));
  EXPECT_EQ(of(10, 3, 1, true), (V{1, 4, 7}));
  EXPECT_EQ(of(10, 3, 2, true), (V{2, 5, 8}));
  // Divisible sizes are the same with or without drop_last.
  EXPECT_EQ(of(12, 4, 3, true), of(12, 4, 3, false));
  EXPECT_EQ(of(12, 4, 3, false), (V{3, 7, 11}));
}

TEST(DistributedSamplerTest, PaddingLongerThanTheDatasetRepeatsItWhole) {
  // torch: N=2, R=5 -> total 5, indices (indices * 3)[:5] = [0, 1, 0, 1, 0].
  const V want[] = {{0}, {1}, {0}, {1}, {0}};
  for (int r = 0; r < 5; ++r) EXPECT_EQ(of(2, 5, r, false), want[r]);
  for (int r = 0; r < 5; ++r) EXPECT_TRUE(of(2, 5, r, true).empty());
}

TEST(DistributedSamplerTest, ShuffleIsSharedByRanksAndChangesWithEpoch) {
  const int64_t n = 1001;
  for (int64_t epoch : {0, 1}) {
    std::multiset<int64_t> all;
    for (int r = 0; r < 4; ++r) {
      V mine = of(n, 4, r, false, true, epoch);
      all.insert(mine.begin(), mine.end());
    }
    EXPECT_EQ(all.size(), 1004u);  // 3 padded
    for (int64_t i = 0; i < n; ++i) EXPECT_GE(all.count(i), 1u) << i;
  }
  EXPECT_NE(of(n, 4, 0, false, true, 0), of(n, 4, 0, false, true, 1));
  EXPECT_EQ(of(n, 4, 2, false, true, 3), of(n, 4, 2, false, true, 3));
  EXPECT_NE(of(n, 4, 0, false, true, 0), of(n, 4, 0, false, false, 0));
}

TEST(StridedSamplerTest, ShardsCoverEveryIndexExactlyOnce) {
  std::multiset<int64_t> all;
  for (int r = 0; r < 3; ++r) {
    StridedSampler s(10, 3, r);
    V mine = s.indices();
    EXPECT_EQ(int64_t(mine.size()), s.size());
    all.insert(mine.begin(), mine.end());
  }
  EXPECT_EQ(all, (std::multiset<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(StridedSampler(2, 4, 3).size(), 0);
}

TEST(DistributedSamplerTest, BadArgumentsAreErrors) {
  rg::testing::expect_error([] { DistributedSampler(10, 0, 0); }, "num_replicas must be >= 1");
  rg::testing::expect_error([] { DistributedSampler(10, 2, 2); }, "rank 2 is outside");
}

}  // namespace
}  // namespace rg::data
