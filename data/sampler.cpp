// Sequential and random samplers.
#include "data/sampler.h"

#include <algorithm>
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

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  return random_permutation(n, seed + uint64_t(epoch));
}

RankBatches resplit_remaining(std::span<const int64_t> remaining, int ranks, int rank,
                              int64_t batch_size) {
  const int64_t n = int64_t(remaining.size()), w = ranks;
  RG_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "resplit_remaining: rank ", rank, " of ", ranks,
           " is invalid");
  RG_CHECK(batch_size >= 1, "resplit_remaining: batch size must be positive, got ", batch_size);
  RG_CHECK(n >= w, "the epoch has ", n, " samples left, fewer than the ", w,
           " ranks: every rank needs one (resume with at most ", n,
           " ranks, or from another snapshot)");
  // ceil(n / (w b)) steps keep batches within b; floor(n / w) keeps every chunk >= w samples.
  const int64_t steps =
      std::max<int64_t>(1, std::min((n + w * batch_size - 1) / (w * batch_size), n / w));
  RankBatches out;
  out.indices.reserve(size_t(n / w + 1));
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t begin = k * n / steps, end = (k + 1) * n / steps;
    for (int64_t i = begin + rank; i < end; i += w) out.indices.push_back(remaining[size_t(i)]);
    out.bounds.push_back(int64_t(out.indices.size()));
    out.consumed.push_back(end);
  }
  return out;
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

std::vector<int64_t> RandomSampler::indices() const { return epoch_order(n_, seed_, epoch_); }

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
    order = epoch_order(n_, seed_, epoch_);
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
