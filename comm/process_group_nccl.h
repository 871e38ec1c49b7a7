// ProcessGroupNCCL: GPU collectives over NCCL. The unique id travels through the store; the
// collectives run on the group's own communication stream after the current stream's work; a
// Work's wait() makes the current stream wait for it without blocking the host. A watchdog thread
// completes works, and on a timeout or an asynchronous NCCL error aborts the communicator and
// fails the pending works with an error that names the operation and the ranks behind.
#pragma once

#include <memory>

#include "comm/process_group.h"

namespace rg::dist {

// True when ringgrad was built with NCCL and a CUDA device is visible.
bool nccl_available();

class ProcessGroupNCCL : public ProcessGroup {
 public:
  // device -1: rank % device_count(). Throws rg::Error without NCCL or a CUDA device.
  ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size,
                   ProcessGroupOptions options = {}, int device = -1);
  ~ProcessGroupNCCL() override;

  const char* backend() const override { return "nccl"; }
  int device() const;
  Device tensor_device() const override { return Device::cuda(device()); }
  WorkPtr all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum) override;
  WorkPtr broadcast(const Tensor& tensor, int root) override;
  WorkPtr all_gather(const Tensor& output, const Tensor& input) override;
  WorkPtr reduce_scatter(const Tensor& output, const Tensor& input,
                         ReduceOp op = ReduceOp::sum) override;
  WorkPtr barrier() override;
  WorkPtr send(const Tensor& tensor, int dst, uint32_t tag = 0) override;
  WorkPtr recv(const Tensor& tensor, int src, uint32_t tag = 0) override;
  // A modelled all-reduce (SimulatedLinkGroup): occupies the communication stream for `us`
  // microseconds once it gets there (after the current stream's work so far, as a collective
  // would), moving no data and taking no SM: a host function that sleeps. On the trace it is the
  // NCCL stream's span "all_reduce ... modelled"; the Work behaves as all_reduce's.
  WorkPtr modelled_all_reduce(const Tensor& tensor, double us);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rg::dist
