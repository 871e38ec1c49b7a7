// How DDP groups parameters into buckets, as PyTorch's compute_bucket_assignment_by_size does:
// walk the parameters in the order their gradients are expected to be ready, keep one open
// bucket per dtype/device, close it once it holds at least the current cap (the first bucket of
// each dtype uses the smaller first cap), and order the buckets by when they close.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rg::dist {

struct BucketAssignmentInput {
  std::vector<size_t> order;  // parameter indices, expected ready order
  std::vector<size_t> bytes;  // per parameter index
  std::vector<int> key;       // per parameter index: dtype/device class
  size_t first_cap_bytes = size_t(1) << 20;
  size_t cap_bytes = size_t(25) << 20;
};

// Each bucket lists parameter indices in the order they were added.
std::vector<std::vector<size_t>> assign_buckets(const BucketAssignmentInput& in);

}  // namespace rg::dist
