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

}  // namespace rg::data
