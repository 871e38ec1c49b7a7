// PowerSGD's three phases in one process (world size 1, so the all-reduces are identities):
// a matrix of rank <= r comes back exactly, a higher-rank one comes back as its rank-r
// approximation with the rest kept as error and fed into the next round, and vectors pass
// uncompressed. Its state (errors, Q's) exported and loaded into a fresh instance continues bit
// for bit; comm/reducer_snapshot's reading of a snapshot takes each rank's own part, or only the
// Q's when the world size changed.
#include "comm/powersgd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sstream>

#include "comm/reducer_snapshot.h"
#include "engine/generator.h"
#include "engine/ops/factory.h"
#include "support/errors.h"

namespace rg::dist {
namespace {

// One round through PowerSGD with world size 1: flat becomes the decompressed bucket.
void round_trip(PowerSgd& psgd, Tensor& flat, const std::vector<Shape>& shapes) {
  Tensor p = psgd.begin(0, flat, shapes);
  Tensor q = psgd.middle(0, flat, p);
  psgd.finish(0, flat, q);
}

// A bucket holding a 6 x 5 matrix u1 v1^T + u2 v2^T (rank 2) followed by a 4-vector.
Tensor rank_two_bucket() {
  std::vector<float> v(34);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 5; ++j)
      v[size_t(i * 5 + j)] = float((i + 1) * (j - 2) + (i % 2) * (j * j - 3));
  for (int k = 0; k < 4; ++k) v[size_t(30 + k)] = float(k) - 1.5f;
  return from_vector(v, {34});
}

TEST(PowerSgdTest, MatrixOfRankAtMostRComesBackExactlyAndVectorsPassThrough) {
  PowerSgdOptions o;
  o.rank = 2;
  o.min_compression_rate = 0;
  PowerSgd psgd(o, 1);
  Tensor flat = rank_two_bucket();
  const auto want = flat.to_vector<float>();
  round_trip(psgd, flat, {{6, 5}, {4}});
  const auto got = flat.to_vector<float>();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << i;
}

TEST(PowerSgdTest, RankOneKeepsWhatItLostAsErrorAndSendsItNextRound) {
  PowerSgdOptions o;
  o.rank = 1;
  o.min_compression_rate = 0;
  PowerSgd psgd(o, 1);
  Tensor g = rank_two_bucket();
  const auto want = g.to_vector<float>();
  // Round 1 loses the second direction; round 2 with a zero gradient sends (part of) it. What
  // both rounds delivered together is closer to g than round 1 alone.
  Tensor flat = g.clone();
  round_trip(psgd, flat, {{6, 5}, {4}});
  const auto first = flat.to_vector<float>();
  double err1 = 0;
  for (size_t i = 0; i < 30; ++i) err1 += std::pow(first[i] - want[i], 2);
  EXPECT_GT(err1, 1e-3) << "rank 1 cannot represent a rank-2 matrix";
  for (size_t i = 30; i < 34; ++i) EXPECT_FLOAT_EQ(first[i], want[i]);  // uncompressed
  Tensor zero = zeros({34});
  round_trip(psgd, zero, {{6, 5}, {4}});
  const auto second = zero.to_vector<float>();
  double err2 = 0;
  for (size_t i = 0; i < 30; ++i) err2 += std::pow(first[i] + second[i] - want[i], 2);
  EXPECT_LT(err2, 0.5 * err1);
}

// Rounds 1..n on gradients that change each round (so the error and Q carry information).
Tensor gradient(int round) {
  Generator g(100 + uint64_t(round));
  return randn({34}, g);
}

std::vector<float> next_round(PowerSgd& psgd, int round) {
  Tensor flat = gradient(round);
  round_trip(psgd, flat, {{6, 5}, {4}});
  return flat.to_vector<float>();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

PowerSgdOptions rank_one() {
  PowerSgdOptions o;
  o.rank = 1;
  o.min_compression_rate = 0;
  return o;
}

TEST(PowerSgdTest, ExportedStateContinuesBitIdenticallyInAFreshInstance) {
  PowerSgd a(rank_one(), 1);
  for (int round = 1; round <= 3; ++round) next_round(a, round);
  const PowerSgd::State saved = a.state();
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved.at(0).error.numel(), 34);
  EXPECT_EQ(saved.at(0).q.numel(), 5);  // m * r of the 6 x 5 matrix
  PowerSgd b(rank_one(), 1);
  b.load_state(saved);
  // Not taken yet (no round since): still the state.
  EXPECT_EQ(b.state().at(0).q.to_vector<float>(), saved.at(0).q.to_vector<float>());
  const auto want = next_round(a, 4);
  EXPECT_TRUE(same_bits(next_round(b, 4), want));
  EXPECT_TRUE(same_bits(next_round(b, 5), next_round(a, 5)));
  // Without the state the same round differs, so the comparison above can fail.
  PowerSgd fresh(rank_one(), 1);
  EXPECT_FALSE(same_bits(next_round(fresh, 4), want));
  // Error and Q both matter: dropping either changes the round.
  PowerSgd::State no_error = saved;
  no_error.at(0).error = Tensor();
  PowerSgd c(rank_one(), 1);
  c.load_state(no_error);
  EXPECT_FALSE(same_bits(next_round(c, 4), want));
}

// Another world size: the Q's are kept and the errors start at zero (as an all-zero error would).
TEST(PowerSgdTest, AStateWithoutErrorsKeepsTheQsAndStartsFromZeroError) {
  PowerSgd a(rank_one(), 1);
  for (int round = 1; round <= 3; ++round) next_round(a, round);
  PowerSgd::State q_only = a.state(), zero_error = a.state();
  q_only.at(0).error = Tensor();
  zero_error.at(0).error = zeros({34});
  PowerSgd b(rank_one(), 1), c(rank_one(), 1), fresh(rank_one(), 1);
  b.load_state(q_only);
  c.load_state(zero_error);
  const auto got = next_round(b, 4);
  EXPECT_TRUE(same_bits(got, next_round(c, 4)));
  EXPECT_FALSE(same_bits(got, next_round(fresh, 4))) << "the Q's were not kept";
}

TEST(PowerSgdTest, AStateOfAnotherLayoutIsAClearErrorAndResetForgetsALoadedState) {
  PowerSgd a(rank_one(), 1);
  next_round(a, 1);
  PowerSgd::State saved = a.state();
  PowerSgdOptions two = rank_one();
  two.rank = 2;
  PowerSgd b(two, 1);
  b.load_state(saved);
  testing::expect_error([&] { next_round(b, 2); },
                        "the restored Q factors of bucket 0 have 5 elements, its layout needs 10");
  PowerSgd c(rank_one(), 1);
  saved.at(0).error = zeros({30});
  c.load_state(saved);
  testing::expect_error([&] { next_round(c, 2); },
                        "the restored error of bucket 0 has 30 elements");
  PowerSgd d(rank_one(), 1);
  d.load_state(a.state());
  d.reset();  // a rebuild: the state belonged to the old buckets
  EXPECT_TRUE(d.state().empty());
  PowerSgd fresh(rank_one(), 1);
  EXPECT_TRUE(same_bits(next_round(d, 2), next_round(fresh, 2)));
}

// A 2-rank snapshot's entries as comm/reducer_snapshot writes them, read back by each rank.
struct SavedSnapshot {
  NamedTensors tensors;
  std::map<std::string, std::string> metadata;
};

SavedSnapshot two_rank_snapshot() {
  SavedSnapshot s;
  s.metadata = {{"ddp.synced_iterations", "9"},
                {"powersgd.world_size", "2"},
                {"powersgd.options",
                 "rank=1 start_iter=10 min_compression_rate=0 error_feedback=1 "
                 "warm_start=1 seed=0"}};
  s.tensors = {{"model.w", full({2}, 9.0)},
               {"powersgd.bucket0.q", full({5}, 1.0)},
               {"powersgd.rank0.bucket0.error", full({34}, 0.5)},
               {"powersgd.rank1.bucket0.error", full({34}, -0.5)},
               {"powersgd.rank1.bucket0.q", full({5}, 2.0)}};
  return s;
}

TEST(PowerSgdTest, EachRankReadsItsOwnPartOfASnapshotOrOnlyTheQsAtAnotherWorldSize) {
  const PowerSgdOptions o = rank_one();
  const SavedSnapshot s = two_rank_snapshot();
  std::ostringstream log;
  for (int rank : {0, 1}) {
    const PowerSgd::State st = powersgd_state_for_rank(s.tensors, s.metadata, o, rank, 2, log);
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st.at(0).error.to_vector<float>(), std::vector<float>(34, rank == 0 ? 0.5f : -0.5f));
    // Rank 1's Q differed from rank 0's, so it has its own.
    EXPECT_EQ(st.at(0).q.to_vector<float>(), std::vector<float>(5, rank == 0 ? 1.f : 2.f));
  }
  EXPECT_EQ(log.str(), "");
  for (int world : {1, 4}) {
    std::ostringstream other;
    const PowerSgd::State st = powersgd_state_for_rank(s.tensors, s.metadata, o, 0, world, other);
    ASSERT_EQ(st.size(), 1u);
    EXPECT_FALSE(st.at(0).error.defined());
    EXPECT_EQ(st.at(0).q.to_vector<float>(), std::vector<float>(5, 1.f));
    EXPECT_EQ(other.str(),
              "ringgrad-train: PowerSGD: the snapshot was taken with 2 ranks, this run has " +
                  std::to_string(world) +
                  ": its Q factors are kept (warm start), the error feedback starts at zero\n");
  }
  PowerSgdOptions two = o;
  two.rank = 2;
  testing::expect_error([&] { powersgd_state_for_rank(s.tensors, s.metadata, two, 0, 2, log); },
                        "the snapshot's PowerSGD options are 'rank=1 ");
  SavedSnapshot missing = s;
  missing.tensors.erase(missing.tensors.begin() + 3);
  testing::expect_error(
      [&] { powersgd_state_for_rank(missing.tensors, missing.metadata, o, 1, 2, log); },
      "no PowerSGD error of rank 1 for bucket 0");
  testing::expect_error([&] { powersgd_state_for_rank(s.tensors, {}, o, 0, 2, log); },
                        "the snapshot holds no PowerSGD state");
  SavedSnapshot no_q = s;
  no_q.tensors.erase(no_q.tensors.begin() + 1);
  testing::expect_error([&] { powersgd_state_for_rank(no_q.tensors, no_q.metadata, o, 0, 2, log); },
                        "no PowerSGD Q factors for bucket 0 (powersgd.bucket0.q)");
  SavedSnapshot huge = s;
  huge.tensors.emplace_back("powersgd.bucket123456789012.q", full({5}, 0.0));
  testing::expect_error([&] { powersgd_state_for_rank(huge.tensors, huge.metadata, o, 0, 2, log); },
                        "unexpected PowerSGD entry 'powersgd.bucket123456789012.q'");
  SavedSnapshot odd = s;
  odd.tensors.emplace_back("powersgd.rank2.bucket0.error", full({34}, 0.0));
  testing::expect_error([&] { powersgd_state_for_rank(odd.tensors, odd.metadata, o, 0, 2, log); },
                        "names rank 2 of a 2-rank run");
}

}  // namespace
}  // namespace rg::dist
