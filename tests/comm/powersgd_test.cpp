// PowerSGD's three phases in one process (world size 1, so the all-reduces are identities):
// a matrix of rank <= r comes back exactly, a higher-rank one comes back as its rank-r
// approximation with the rest kept as error and fed into the next round, and vectors pass
// uncompressed.
#include "comm/powersgd.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/generator.h"
#include "engine/ops/factory.h"

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

}  // namespace
}  // namespace rg::dist
