// Explicit random-number generator: a Philox stream identified by (seed, offset). Each random op
// reserves a range of counters, so results depend only on the seed and the order of ops.
#pragma once

#include <cstdint>

namespace rg {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  // Reserves `groups` Philox counters (4 words each) and returns the first one.
  uint64_t reserve(uint64_t groups) {
    const uint64_t first = offset_;
    offset_ += groups;
    return first;
  }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

}  // namespace rg
