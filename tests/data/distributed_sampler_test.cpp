// DistributedSampler against PyTorch's documented partition (padding by wrapping, drop_last,
// rank-strided split) and its shuffling contract (seed + epoch, identical on every rank).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
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

// The epoch's order is one permutation whatever the number of ranks: RandomSampler's, and the
// ranks' full steps interleaved give its prefix (what a resume at another world size relies on).
TEST(DistributedSamplerTest, FullStepsOfAnyWorldSizeArePrefixesOfTheEpochOrder) {
  const int64_t n = 103, batch = 4;
  for (int64_t epoch : {0, 3}) {
    const V order = epoch_order(n, 5, epoch);
    RandomSampler single(n, 5);
    single.set_epoch(epoch);
    EXPECT_EQ(single.indices(), order);
    for (int r : {1, 2, 3, 5}) {
      std::vector<V> mine;
      for (int rank = 0; rank < r; ++rank) mine.push_back(of(n, r, rank, false, true, epoch));
      V done;
      for (int64_t step = 0; (step + 1) * batch <= int64_t(mine[0].size()); ++step) {
        for (int64_t i = step * batch; i < (step + 1) * batch; ++i)
          for (int rank = 0; rank < r; ++rank) done.push_back(mine[size_t(rank)][size_t(i)]);
        if (int64_t(done.size()) > n) break;  // the padding's repeats
        ASSERT_TRUE(std::equal(done.begin(), done.end(), order.begin()))
            << r << " ranks, step " << step;
      }
    }
  }
}

// Re-splitting what is left of an epoch: every sample exactly once, the same number of steps on
// every rank, non-empty batches within the batch size, ranks within one sample of each other.
TEST(ResplitRemainingTest, EverySampleOnceAndEqualStepsOnEveryRank) {
  for (int64_t n : {1, 2, 3, 7, 16, 64, 100, 128, 1000}) {
    V remaining(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) remaining[size_t(i)] = 1000 + 3 * i;
    for (int ranks : {1, 2, 3, 4, 7}) {
      if (n < ranks) {
        rg::testing::expect_error([&] { resplit_remaining(remaining, ranks, 0, 4); },
                                  "fewer than the");
        continue;
      }
      for (int64_t batch : {1, 2, 5, 16}) {
        std::multiset<int64_t> all;
        std::vector<RankBatches> split;
        for (int rank = 0; rank < ranks; ++rank)
          split.push_back(resplit_remaining(remaining, ranks, rank, batch));
        const int64_t steps = split[0].size();
        for (int rank = 0; rank < ranks; ++rank) {
          const RankBatches& b = split[size_t(rank)];
          ASSERT_EQ(b.size(), steps) << "rank " << rank;
          EXPECT_EQ(b.consumed, split[0].consumed);
          EXPECT_EQ(b.consumed.back(), n);
          all.insert(b.indices.begin(), b.indices.end());
          for (int64_t k = 0; k < steps; ++k) {
            const int64_t size = b.bounds[size_t(k + 1)] - b.bounds[size_t(k)];
            EXPECT_GE(size, 1);
            EXPECT_LE(size, batch == 1 ? 2 : batch) << n << " " << ranks << " " << batch;
            const int64_t other = split[0].bounds[size_t(k + 1)] - split[0].bounds[size_t(k)];
            EXPECT_LE(std::abs(size - other), 1);
          }
        }
        EXPECT_EQ(all, std::multiset<int64_t>(remaining.begin(), remaining.end()));
        // As few steps as the batch size allows (one more can only come from ranks' shares).
        EXPECT_EQ(steps, std::max<int64_t>(
                             1, std::min((n + ranks * batch - 1) / (ranks * batch), n / ranks)));
      }
    }
  }
  // Step k's chunk is contiguous in the epoch's order, strided over the ranks as
  // DistributedSampler's own full steps.
  const V remaining = {10, 11, 12, 13, 14, 15, 16};
  const RankBatches r1 = resplit_remaining(remaining, 2, 1, 2);
  EXPECT_EQ(r1.indices, (V{11, 14, 16}));  // chunks {10, 11, 12}, {13, 14, 15, 16}
  EXPECT_EQ(r1.bounds, (V{0, 1, 3}));
  EXPECT_EQ(r1.consumed, (V{3, 7}));
}

TEST(DistributedSamplerTest, BadArgumentsAreErrors) {
  rg::testing::expect_error([] { DistributedSampler(10, 0, 0); }, "num_replicas must be >= 1");
  rg::testing::expect_error([] { DistributedSampler(10, 2, 2); }, "rank 2 is outside");
}

}  // namespace
}  // namespace rg::data
