// ShmGroup: shared-memory collectives (all-reduce, broadcast, all-gather, barrier) for the ranks of
// a process group that all run on one host.
// One segment per group (created by rank 0 with shm_open, its name published through the store,
// attached by every rank, then unlinked at once so a crash leaves nothing in /dev/shm) holds two
// sets of one slot per rank; an all-reduce is pipelined over chunks of one slot each, so memory
// stays bounded whatever the message size. Per chunk every rank copies the other ranks' slices
// of its input into its slot, reduces its own slice over all ranks (in rank order, so every rank
// gets the same bits), and copies every rank's reduced slice back. Progress is one
// sequence-numbered counter per rank in the segment (lock-free atomics, acquire/release);
// waits spin briefly, then yield and sleep, and check the deadline and that the peers they wait
// for are still alive, so a dead peer ends in an rg::Error naming it instead of a hang.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/store.h"

namespace rg::dist {

// This host's identity for deciding which ranks may share memory: RG_HOST_ID when set (tests use
// it to put ranks on "different hosts"), else the host name and the kernel's boot id.
std::string host_identity();

struct ShmReduceArgs {
  void* data = nullptr;  // count elements, reduced in place
  size_t count = 0;
  size_t element_size = 0;
  // out[i] = a[i] op b[i] for i < n; out may alias a.
  std::function<void(void* out, const void* a, const void* b, size_t n)> reduce;
  // Applied once to each fully reduced slice (the average's division); may be empty.
  std::function<void(void* data, size_t n)> finalize;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

class ShmGroup {
 public:
  // Collective over `store` (the group's namespaced store): every rank of the group calls it.
  // Returns null on every rank when the group has one rank, when its ranks are not all on one
  // host, or when any rank could not map the segment; the caller then uses the network.
  // `slot_bytes` is the chunk size of the pipeline (rounded down to a multiple of 64, and capped
  // so that the 2 * size slots take at most 32 MiB).
  static std::unique_ptr<ShmGroup> create(Store& store, int rank, int size, size_t slot_bytes,
                                          Millis timeout);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // Every rank's data becomes the reduction over all ranks. Throws rg::Error at the deadline
  // ("timed out") or when a peer has exited; the group is unusable afterwards.
  void all_reduce(const ShmReduceArgs& args);
  // The same pipeline without the reduction: root's `bytes` to every rank; every rank's input
  // (`bytes`) into block r of output (size() * bytes; the input may be this rank's block); a
  // barrier. Errors as all_reduce.
  void broadcast(void* data, size_t bytes, int root, std::chrono::steady_clock::time_point deadline);
  void all_gather(const void* input, void* output, size_t bytes,
                  std::chrono::steady_clock::time_point deadline);
  void barrier(std::chrono::steady_clock::time_point deadline);

 private:
  struct Control;
  ShmGroup(int rank, int size, size_t slot_bytes, void* base, size_t bytes);
  Control& control(int r) const;
  char* slot(uint64_t chunk, int r) const;
  // Starts the next chunk: waits until its slot set is free; returns its number.
  uint64_t next_chunk(std::chrono::steady_clock::time_point deadline);
  void reduce_chunk(const ShmReduceArgs& a, char* data, size_t len);
  void publish(uint64_t stage);
  // Until rank q's (every other rank's) stage reaches `stage`; rg::Error on failure.
  void wait_for(int q, uint64_t stage, std::chrono::steady_clock::time_point deadline);
  void wait_all(uint64_t stage, std::chrono::steady_clock::time_point deadline);
  void check_peer(int q, uint64_t stage, std::chrono::steady_clock::time_point deadline);

  const int rank_, size_;
  const size_t slot_bytes_;
  void* base_;
  size_t bytes_;
  const bool oversubscribed_;  // more ranks than cores: sleep instead of yielding
  uint64_t chunk_ = 0;         // chunks run so far: every rank runs the same sequence
};

}  // namespace rg::dist
