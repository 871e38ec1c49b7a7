// Explicit random-number generator: a Philox stream identified by (seed, offset). Each random op
// reserves a range of counters, so results depend only on the seed and the order of ops.
// default_generator()/manual_seed: the process-wide one that layers built without a Generator& use.
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

// The process-wide generator (as torch's default CPU generator): layer constructors without a
// Generator& argument initialize from it, and Dropout layers built without one draw masks from it.
// Its seed until manual_seed is called is fixed (67280421310721, PyTorch's default seed; the
// numbers drawn differ from PyTorch's, whose generator is another). Not thread-safe: build models
// and run dropout forwards that use it from one thread at a time, or pass an explicit Generator.
Generator& default_generator();

// Reseeds default_generator() to (seed, offset 0), as torch.manual_seed: two models built after the
// same manual_seed are bit-identical, and equal to ones built from an explicit Generator(seed).
void manual_seed(uint64_t seed);

}  // namespace rg
