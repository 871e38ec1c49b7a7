// Samplers decide the order of sample indices per epoch. RandomSampler and DistributedSampler
// shuffle with the same Philox permutation seeded by seed + epoch (epoch_order), so the order is
// reproducible, changes with set_epoch and does not depend on the number of ranks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace rg::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual std::vector<int64_t> indices() const = 0;  // for the current epoch
  virtual int64_t size() const = 0;                  // indices().size()
  virtual void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

 protected:
  int64_t epoch_ = 0;
};

class SequentialSampler final : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

class RandomSampler final : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// PyTorch's DistributedSampler: each of `num_replicas` ranks gets num_samples = ceil(N / R)
// indices (with drop_last and N % R != 0: ceil((N - R) / R)); the (optionally shuffled) order is
// padded by repeating its start (or truncated with drop_last) to R * num_samples, and rank r
// takes positions r, r + R, r + 2R, ... The shuffle is seeded by seed + epoch, like PyTorch's,
// but drawn from our Philox permutation, so the shuffled order itself differs from torch's.
class DistributedSampler final : public Sampler {
 public:
  DistributedSampler(int64_t n, int num_replicas, int rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return num_samples_; }
  int64_t total_size() const { return num_samples_ * num_replicas_; }

 private:
  int64_t n_;
  int num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
};

// Indices rank, rank + R, rank + 2R, ... below n: disjoint shards that together cover [0, n)
// exactly once (sharded evaluation, where padding would count samples twice).
class StridedSampler final : public Sampler {
 public:
  StridedSampler(int64_t n, int num_replicas, int rank);
  std::vector<int64_t> indices() const override;
  int64_t size() const override;

 private:
  int64_t n_;
  int num_replicas_, rank_;
};

// A permutation of [0, n) from Philox(seed), by Fisher-Yates.
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed);

// The shuffled order of an epoch: random_permutation(n, seed + epoch), as PyTorch's
// DistributedSampler seeds its generator. RandomSampler's order, and DistributedSampler's before
// padding at any number of ranks: after s full steps of batch b on r ranks the epoch's first
// s * b * r positions have been trained on, whatever r was.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);

// One rank's batches given explicitly: batch k is indices[bounds[k], bounds[k + 1]).
// consumed[k] counts the samples of every rank's batches 0..k together.
struct RankBatches {
  std::vector<int64_t> indices, bounds = {0}, consumed;
  int64_t size() const { return int64_t(bounds.size()) - 1; }
};

// What is left of an epoch (`remaining`, in the epoch's order) re-split over `ranks` ranks, for a
// run resumed at another world size: every sample exactly once, and every rank runs the same
// number of steps. Step k takes a contiguous chunk of `remaining`, the chunks as equal as integers
// allow, and rank r takes the chunk's positions r, r + ranks, ... (DistributedSampler's own layout
// with full batches). There are min(ceil(n / (ranks * batch)), floor(n / ranks)) steps, so every
// rank's batch is non-empty and at most `batch_size` samples (batch size 1: at most 2). Ranks'
// batches in one step differ by at most one sample. Needs at least `ranks` samples.
RankBatches resplit_remaining(std::span<const int64_t> remaining, int ranks, int rank,
                              int64_t batch_size);

}  // namespace rg::data
