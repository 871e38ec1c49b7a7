// Our ring all-reduce: a reduce-scatter then an all-gather, each n-1 steps around the ring
// (rank r sends to r+1 and receives from r-1). Every step is split into chunks and pipelined:
// a chunk is forwarded to the next step as soon as it has been reduced or received, so sending,
// receiving and reducing overlap. Written once over PointToPoint and a reduction callback.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "comm/p2p.h"

namespace rg::dist {

struct RingArgs {
  void* data = nullptr;  // count elements, reduced in place
  size_t count = 0;
  size_t element_size = 0;
  // dst[i] = dst[i] op src[i] for i < n (the reduce-scatter's step).
  std::function<void(void* dst, const void* src, size_t n)> reduce;
  // Applied once to each fully reduced block before it is shared (the average's division);
  // may be empty.
  std::function<void(void* data, size_t n)> finalize;
  // Receive buffer of at least ring_scratch_bytes(...) bytes.
  void* scratch = nullptr;
  size_t chunk_bytes = size_t(1) << 20;
  uint64_t slot_base = 0;  // distinct per operation (see ring_slot_base)
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

// Slot bases for operation `seq`: slots are base + (step << 20) + chunk.
uint64_t ring_slot_base(uint64_t seq);

// Where block b (0 <= b < n) of `count` elements starts: blocks differ by at most one element,
// so any count works (count < n leaves some blocks empty).
size_t ring_block_begin(size_t count, int n, int b);
size_t ring_scratch_bytes(size_t count, int n, size_t element_size);

// Every rank's data becomes the reduction over all ranks.
void ring_all_reduce(PointToPoint& p2p, const RingArgs& args);
// Afterwards block rank() of data holds the reduction of that block over all ranks (the other
// blocks hold partial sums).
void ring_reduce_scatter(PointToPoint& p2p, const RingArgs& args);
// Block rank() of data is this rank's contribution; afterwards data holds every rank's block.
// (reduce and scratch are unused.)
void ring_all_gather(PointToPoint& p2p, const RingArgs& args);

}  // namespace rg::dist
