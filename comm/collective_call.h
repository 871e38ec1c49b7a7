// CollectiveCall: what one rank asked a process group to do (the fingerprint of a collective or
// point-to-point op), shared by the DETAIL cross-rank check (comm/debug_group.h) and the flight
// recorder (comm/flight_recorder.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace rg::dist {

struct CollectiveCall {
  std::string group = "default";  // the process group's name (ProcessGroupOptions::name)
  uint64_t seq = 0;               // the group's sequence number of this call, from 1
  std::string op;                 // "all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                  // "barrier", "send", "recv"
  std::string reduce_op;          // "sum", ... for reductions; empty otherwise
  int root = -1;                  // broadcast's root; send's destination; recv's source; else -1
  uint32_t tag = 0;               // send/recv
  std::string dtype;              // "f32", ...; empty for barrier
  std::vector<Shape> shapes;      // the tensors' shapes (input first, then output where two)
  std::string device;             // "cpu", "cuda:0", ...

  int64_t numel() const;  // of the first tensor (0 for barrier)
  // "all_reduce #12 (f32[1000], sum)", "broadcast #3 (f32[10], root 0)", "barrier #4",
  // "send #2 (f32[4] to 1, tag 0)": for messages.
  std::string describe() const;
  // Everything but seq and device (every rank's device differs under NCCL) as one line; equal
  // strings mean the same call. Also the store's encoding.
  std::string fingerprint() const;
  bool same_call_as(const CollectiveCall& other) const {
    return fingerprint() == other.fingerprint();
  }
};

}  // namespace rg::dist
