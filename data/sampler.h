// Samplers decide the order of sample indices per epoch. RandomSampler shuffles with Philox
// seeded by (seed, epoch), so the order is reproducible and changes with set_epoch.
#pragma once

#include <cstdint>
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

// A permutation of [0, n) from Philox(seed), by Fisher-Yates. Shared with DistributedSampler.
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed);

}  // namespace rg::data
