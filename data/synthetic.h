// Synthetic classification data for benchmarks and tests: sample i is N(0,1) noise drawn from
// Philox(seed, i) and its label a function of the same stream, so any sample can be regenerated.
#pragma once

#include "data/dataset.h"

namespace rg::data {

class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(int64_t size, Shape sample_shape, int64_t num_classes, uint64_t seed = 0);
  int64_t size() const override { return size_; }
  Batch get_batch(std::span<const int64_t> indices, int64_t epoch) const override;
  Shape sample_shape() const override { return sample_shape_; }
  int64_t num_classes() const override { return num_classes_; }

 private:
  int64_t size_;
  Shape sample_shape_;
  int64_t num_classes_;
  uint64_t seed_;
};

// `batch` samples of `block` uniformly random token ids in [0, vocab) with targets of the same
// shape (also random: for speed measurements, not learning), from a generator seeded by `seed`:
// the GPT benchmarks' batches.
Batch random_token_batch(int64_t batch, int64_t block, int64_t vocab, uint64_t seed);

}  // namespace rg::data
