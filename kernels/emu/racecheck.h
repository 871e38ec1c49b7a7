// The emulator's stream-race detector: happens-before between streams and the host from vector
// clocks, and a shadow record of who last touched each range of emulated memory, so that an
// access unordered with a conflicting access from another stream, or a block freed or reused
// while another stream may still use it, is reported with both operations named.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace rg::emu::detail {

// One counter per stream (index 0 is the host): entry i is the last operation of stream i known
// to have happened before.
class VectorClock {
 public:
  uint64_t get(size_t i) const { return i < v_.size() ? v_[i] : 0; }
  uint64_t tick(size_t i);  // a new operation of stream i; returns its epoch
  void join(const VectorClock& other);

 private:
  std::vector<uint64_t> v_;
};

// Who did something: stream index and epoch, plus names for the report.
struct Actor {
  size_t stream = 0;
  uint64_t epoch = 0;
  std::shared_ptr<const std::string> what;   // "kernel add_kernel", "cudaMemcpyAsync 4096 bytes"
  std::shared_ptr<const std::string> where;  // "cuda:0/stream 3", "host"
};

// Called by the runtime under its lock; not thread-safe by itself.
class RaceChecker {
 public:
  // Memory the emulator handed out (device memory or pinned host memory).
  void add_allocation(const void* base, size_t bytes, std::string owner);
  void remove_allocation(const void* base);
  // A caching-allocator block: the extent of kernel pointer arguments into it.
  void add_block(const void* ptr, size_t bytes);
  void remove_block(const void* ptr);

  // `who` (whose clock is `clock`) reads or writes [ptr, ptr + bytes); bytes == ~0: to the end of
  // the block or allocation. Untracked memory is ignored. Returns the reports (empty: no race).
  std::vector<std::string> access(const void* ptr, size_t bytes, bool write, const Actor& who,
                                  const VectorClock& clock);

  // The allocator hands [ptr, ptr + bytes) to `who` (a reuse must be ordered after every earlier
  // use of that memory).
  std::vector<std::string> block_handed_out(const void* ptr, size_t bytes, const Actor& who,
                                             const VectorClock& clock);
  // The allocator has seen the events of a pending free reached: the earlier uses of
  // [ptr, ptr + bytes) are over, so a reuse needs no ordering with them (they are forgotten).
  void block_released(const void* ptr, size_t bytes);
  // The allocator takes the block back at `clock` (the host and the block's stream): every use by
  // a stream not in `also_used_on` (record_stream) must be ordered before.
  std::vector<std::string> block_freed(const void* ptr, size_t bytes, const Actor& who,
                                       const VectorClock& clock,
                                       const std::vector<size_t>& also_used_on);

 private:
  struct Record {
    uintptr_t begin, end;
    bool write;
    Actor who;
  };
  struct Allocation {
    size_t bytes;
    std::string owner;
    std::vector<Record> records;
  };
  Allocation* find(uintptr_t p, uintptr_t* base);
  uintptr_t extent_end(uintptr_t p, uintptr_t alloc_end) const;

  std::map<uintptr_t, Allocation> allocations_;
  std::map<uintptr_t, uintptr_t> blocks_;  // begin -> end
};

// "[0x7f..+4096)"
std::string format_range(uintptr_t begin, uintptr_t end);

}  // namespace rg::emu::detail
