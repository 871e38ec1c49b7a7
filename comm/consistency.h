// Cross-rank consistency checks (ringgrad-train --check-consistency N): every rank hashes its
// parameters and buffers (in DETAIL also the averaged gradients), one all_gather brings every
// rank's hashes to all, and a difference is the same error on every rank, naming the first
// differing tensor and which ranks hold which hash, so ranks that drift apart cannot go unnoticed.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "engine/tensor.h"

namespace rg::dist {

// A 64-bit hash of a tensor's dtype, shape and bytes (xxHash64's rounds over 32-byte blocks, a
// few GB/s), so equal hashes mean bitwise equal tensors up to a 2^-64 chance. CUDA tensors are
// copied to the host first.
uint64_t tensor_hash(const Tensor& t);

// The hashes one check compares, in the order they were added (the first difference in that
// order is the one named).
class ConsistencyCheck {
 public:
  using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

  // Hashes `tensors` now, under their names.
  void add(const NamedTensors& tensors);
  // Hashes each parameter's .grad now, as "<name>.grad" (an undefined one hashes as empty). Call
  // it right after backward, before the optimizer or a clip changes them.
  void add_gradients(const NamedTensors& params);
  size_t size() const { return names_.size(); }

  // Collective: one all_gather of every rank's hashes (an i64 tensor on the group's device, so
  // it works for gloo and NCCL). When any tensor differs, an rg::Error on every rank: "at step 40,
  // fc1.weight differs between ranks: ranks 0, 2 have 0x...; rank 1 has 0x... (first of 3
  // differing tensors)". Every rank must have added the same names in the same order (the same
  // model); a different list is named as such. Clears the hashes.
  void run(ProcessGroup& pg, int64_t step);

 private:
  std::vector<std::string> names_;
  std::vector<uint64_t> hashes_;
};

}  // namespace rg::dist
