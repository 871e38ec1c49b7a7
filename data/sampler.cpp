// Sequential and random samplers.
#include "data/sampler.h"

#include <numeric>
#include <utility>

#include "kernels/error.h"
#include "kernels/philox.h"

namespace rg::data {

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) {
    // 64 random bits per draw keep the modulo bias negligible for any realistic n.
    const philox::U32x4 r = philox::block(seed, uint64_t(i));
    const uint64_t x = uint64_t(r.v[0]) << 32 | r.v[1];
    const int64_t j = int64_t(x % uint64_t(i + 1));
    std::swap(p[size_t(i)], p[size_t(j)]);
  }
  return p;
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  RG_CHECK(n >= 0, "SequentialSampler: size must be non-negative, got ", n);
}

std::vector<int64_t> SequentialSampler::indices() const {
  std::vector<int64_t> p(static_cast<size_t>(n_));
  std::iota(p.begin(), p.end(), 0);
  return p;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  RG_CHECK(n >= 0, "RandomSampler: size must be non-negative, got ", n);
}

std::vector<int64_t> RandomSampler::indices() const {
  // Mix the epoch into the seed so epochs are independent permutations.
  return random_permutation(n_, seed_ * 0x9E3779B97F4A7C15ull + uint64_t(epoch_));
}

DistributedSampler::DistributedSampler(int64_t n, int num_replicas, int rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : n_(n),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  RG_CHECK(num_replicas >= 1, "DistributedSampler: num_replicas must be >= 1, got ", num_replicas);
  RG_CHECK(rank >= 0 && rank < num_replicas, "DistributedSampler: rank ", rank, " is outside [0, ",
           num_replicas, ")");
  RG_CHECK(n >= 0, "DistributedSampler: negative dataset size");
  const int64_t r = num_replicas;
  if (drop_last && n % r != 0)
    num_samples_ = n >= r ? (n - r + r - 1) / r : 0;  // ceil((N - R) / R)
  else
    num_samples_ = (n + r - 1) / r;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (shuffle_) {
    order = random_permutation(n_, seed_ + uint64_t(epoch_));
  } else {
    order.resize(size_t(n_));
    for (int64_t i = 0; i < n_; ++i) order[size_t(i)] = i;
  }
  const size_t total = size_t(total_size());
  if (order.size() < total) {
    RG_CHECK(!order.empty(), "DistributedSampler: cannot pad an empty dataset");
    for (size_t i = 0; order.size() < total; ++i) order.push_back(order[i]);  // wraps around
  }
  order.resize(total);
  std::vector<int64_t> mine;
  mine.reserve(size_t(num_samples_));
  for (size_t i = size_t(rank_); i < total; i += size_t(num_replicas_)) mine.push_back(order[i]);
  return mine;
}

StridedSampler::StridedSampler(int64_t n, int num_replicas, int rank)
    : n_(n), num_replicas_(num_replicas), rank_(rank) {
  RG_CHECK(num_replicas >= 1 && rank >= 0 && rank < num_replicas, "StridedSampler: rank ", rank,
           " of ", num_replicas, " is invalid");
}

int64_t StridedSampler::size() const {
  return n_ > rank_ ? (n_ - rank_ + num_replicas_ - 1) / num_replicas_ : 0;
}

std::vector<int64_t> StridedSampler::indices() const {
  std::vector<int64_t> out;
  out.reserve(size_t(size()));
  for (int64_t i = rank_; i < n_; i += num_replicas_) out.push_back(i);
  return out;
}

}  // namespace rg::data
