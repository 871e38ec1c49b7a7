// Dataset interface: random access to whole batches of (input, target) by sample index.
// Implementations must be safe to call from several loader threads at once.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/tensor.h"

namespace rg::data {

struct Batch {
  Tensor inputs;                 // [B, ...] f32 images, or [B, T] i64 token ids (text)
  Tensor targets;                // [B] i64 class labels, or [B, T] i64 next-token ids (text)
  std::vector<int64_t> indices;  // the samples' dataset indices (set by DataLoader)
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The samples at `indices`, stacked; `epoch` lets transforms vary per epoch reproducibly.
  virtual Batch get_batch(std::span<const int64_t> indices, int64_t epoch) const = 0;
  virtual Shape sample_shape() const = 0;  // e.g. {1, 28, 28}
  virtual int64_t num_classes() const = 0;
};

}  // namespace rg::data
