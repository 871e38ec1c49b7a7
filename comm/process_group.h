// ProcessGroup: a set of ranks that run collectives together. Every collective returns a Work
// at once and runs asynchronously, in issue order; errors (a timeout, a lost peer) name the
// operation, its sequence number and the ranks that never joined it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "comm/store.h"
#include "comm/work.h"
#include "engine/tensor.h"

namespace rg::dist {

enum class ReduceOp : uint8_t { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);

// How all_reduce, reduce_scatter and all_gather are carried out: the backend library's own
// algorithm, our ring (comm/ring_allreduce.h) over the backend's point-to-point transport, or
// (gloo, every rank on one host) shared memory (comm/shm_group.h; broadcast and barrier too).
// `automatic` is shm where the group has it, else native.
enum class Algorithm : uint8_t { native, ring, shm, automatic };
const char* algorithm_name(Algorithm a);
// "native" | "ring" | "shm" | "auto"; rg::Error otherwise
Algorithm parse_algorithm(std::string_view name);

struct ProcessGroupOptions {
  Millis timeout = std::chrono::seconds(300);  // per collective, and for joining the group
  Algorithm algorithm = Algorithm::automatic;
  size_t ring_chunk_bytes = size_t(1) << 20;  // pipelining granularity of the ring
  // Gloo: the chunk (one slot per rank, two sets) of the shared-memory collectives when every
  // rank is on one host (capped so the segment's slots stay within 32 MiB). 0: no shared memory.
  // 1 MiB: at 64 MiB, 4 ranks on 2 cores ran 2.2-2.4 GB/s with 256 KiB, 2.7-3.7 with 1 MiB
  // (fewer waits); 2 ranks ran alike with either.
  size_t shm_chunk_bytes = size_t(1) << 20;
  std::string name = "default";  // namespaces the group's store keys
  // Gloo: the address peers use to reach this rank; empty = 127.0.0.1 for a single-node job,
  // else this host's name.
  std::string hostname;
};

class ProcessGroup;

// `t` on the device pg's collectives take: t itself when it is there, else a copy. Lets host-side
// bookkeeping (shape tables, flags, counts) go through any backend; read results with
// .to(Device::cpu()).
Tensor on_group_device(const ProcessGroup& pg, const Tensor& t);

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size, ProcessGroupOptions options);
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const ProcessGroupOptions& options() const { return options_; }
  virtual const char* backend() const = 0;
  Algorithm algorithm() const { return options_.algorithm; }
  // Where this group's tensors must live: the CPU (gloo), or the group's CUDA device (NCCL).
  virtual Device tensor_device() const { return Device::cpu(); }
  virtual void set_algorithm(Algorithm a) { options_.algorithm = a; }
  // The backend's own group under any recording layer (comm/debug_group.h), for code that needs
  // the concrete backend (ProcessGroupGloo's shared memory, ...).
  virtual ProcessGroup& backend_group() { return *this; }

  // In place: every rank's `tensor` becomes the reduction over ranks.
  virtual WorkPtr all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum) = 0;
  // Every rank's `tensor` becomes root's.
  virtual WorkPtr broadcast(const Tensor& tensor, int root) = 0;
  // output (size() * input.numel() elements) = the inputs of ranks 0..size()-1, concatenated.
  virtual WorkPtr all_gather(const Tensor& output, const Tensor& input) = 0;
  // output = this rank's block (output.numel() elements) of the reduction of the inputs, each
  // of size() * output.numel() elements.
  virtual WorkPtr reduce_scatter(const Tensor& output, const Tensor& input,
                                 ReduceOp op = ReduceOp::sum) = 0;
  virtual WorkPtr barrier() = 0;
  // Point-to-point; a send matches the recv of the same tag on the peer, in order.
  virtual WorkPtr send(const Tensor& tensor, int dst, uint32_t tag = 0) = 0;
  virtual WorkPtr recv(const Tensor& tensor, int src, uint32_t tag = 0) = 0;

 protected:
  // Throws rg::Error (on the caller's thread) for a tensor a collective cannot take.
  void check_tensor(const Tensor& t, const char* op, const char* what) const;
  void check_rank(int r, const char* op, const char* what) const;
  // "all_reduce #7 (f32[1000], sum, ring) on rank 0 of 4": the head of every error message.
  std::string describe(const std::string& op, uint64_t seq, const std::string& detail) const;

  const int rank_;
  const int size_;
  ProcessGroupOptions options_;
};

}  // namespace rg::dist
