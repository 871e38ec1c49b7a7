// Synthetic samples from Philox: counters [i * G, (i + 1) * G) belong to sample i.
#include "data/synthetic.h"

#include <random>
#include <vector>

#include "engine/ops/factory.h"
#include "kernels/cpu/random.h"
#include "kernels/error.h"
#include "kernels/philox.h"

namespace rg::data {

SyntheticDataset::SyntheticDataset(int64_t size, Shape sample_shape, int64_t num_classes,
                                   uint64_t seed)
    : size_(size), sample_shape_(std::move(sample_shape)), num_classes_(num_classes), seed_(seed) {
  RG_CHECK(size >= 0, "SyntheticDataset: size must be non-negative, got ", size);
  RG_CHECK(num_classes > 0, "SyntheticDataset: num_classes must be positive, got ", num_classes);
  shape_numel(sample_shape_);
}

Batch SyntheticDataset::get_batch(std::span<const int64_t> indices, int64_t /*epoch*/) const {
  const int64_t b = int64_t(indices.size());
  const int64_t per = shape_numel(sample_shape_);
  const uint64_t groups = uint64_t(per + 1) / 2 + 1;  // normal() uses 1 counter per 2 values
  Shape shape = sample_shape_;
  shape.insert(shape.begin(), b);
  Batch batch{Tensor::empty(shape), Tensor::empty({b}, DType::i64), {}};
  float* x = batch.inputs.data<float>();
  int64_t* y = batch.targets.data<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t idx = indices[size_t(i)];
    RG_CHECK(idx >= 0 && idx < size_, "SyntheticDataset: index ", idx, " out of range [0, ", size_,
             ")");
    const uint64_t base = uint64_t(idx) * groups;
    kernels::cpu::normal<float>(x + i * per, per, 0.0f, 1.0f, seed_, base);
    y[i] = int64_t(philox::block(seed_, base + groups - 1).v[0] % uint32_t(num_classes_));
  }
  return batch;
}

Batch random_token_batch(int64_t batch, int64_t block, int64_t vocab, uint64_t seed) {
  RG_CHECK(batch > 0 && block > 0 && vocab > 0, "random_token_batch: batch, block and vocab must "
           "be positive, got ", batch, ", ", block, ", ", vocab);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> id(0, vocab - 1);
  const int64_t n = batch * block;
  std::vector<int64_t> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = id(rng);
  for (int64_t i = 0; i < n; ++i) y[size_t(i)] = id(rng);
  return {from_vector(x, {batch, block}), from_vector(y, {batch, block}), {}};
}

}  // namespace rg::data
