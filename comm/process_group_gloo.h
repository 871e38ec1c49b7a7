// ProcessGroupGloo: CPU collectives over Debian's libgloo (TCP). One worker thread per group runs
// the collectives in issue order; `Algorithm::ring` runs ours over gloo's unbound buffers, and
// `Algorithm::shm` (what `automatic` picks when every rank is on this host) runs all_reduce,
// reduce_scatter, broadcast, all_gather and barrier through shared memory (comm/shm_group.h).
#pragma once

#include <memory>

#include "comm/process_group.h"

namespace rg::dist {

class ProcessGroupGloo : public ProcessGroup {
 public:
  // Joins the group through `store` (every rank calls this with the same group name); throws
  // rg::Error naming the ranks that did not join within options.timeout.
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size,
                   ProcessGroupOptions options = {});
  ~ProcessGroupGloo() override;

  const char* backend() const override { return "gloo"; }
  WorkPtr all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum) override;
  WorkPtr broadcast(const Tensor& tensor, int root) override;
  WorkPtr all_gather(const Tensor& output, const Tensor& input) override;
  WorkPtr reduce_scatter(const Tensor& output, const Tensor& input,
                         ReduceOp op = ReduceOp::sum) override;
  WorkPtr barrier() override;
  WorkPtr send(const Tensor& tensor, int dst, uint32_t tag = 0) override;
  WorkPtr recv(const Tensor& tensor, int src, uint32_t tag = 0) override;

  // Whether the group set up its shared-memory segment (every rank on one host, size > 1).
  bool has_shared_memory() const;

 private:
  // What a collective runs: `automatic` resolved; throws for shm without a segment.
  Algorithm effective_algorithm(const char* op) const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rg::dist
