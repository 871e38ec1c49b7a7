// The backward engine: counts dependencies from the roots, then runs ready nodes latest-created
// first, accumulating gradients per node; runs callbacks queued during the pass at its end.
#pragma once

#include <functional>
#include <vector>

#include "engine/tensor.h"

namespace rg::autograd {

class Engine {
 public:
  // gradients[i] seeds roots[i]; an undefined one means ones (allowed only for scalar roots).
  static void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients,
                       bool retain_graph = false);
  // Runs `callback` after every node of the current backward pass has run (DDP waits for its
  // buckets here). Only valid during backward, e.g. from a hook.
  static void queue_callback(std::function<void()> callback);
  static bool in_backward();
};

}  // namespace rg::autograd
