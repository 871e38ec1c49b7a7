// SimulatedLinkGroup: a ProcessGroup whose all-reduces take the time a network link of a given
// bandwidth and latency would need, so all-reduce/backward overlap can be studied on one
// machine. The simulated all-reduce moves no data (each rank keeps its own values: use it for
// timing only); it completes latency + busbytes / bandwidth after the link becomes free, where
// busbytes = bytes * 2(n-1)/n as for a ring, and the link carries one collective at a time.
// Waiting is a sleep on a timer thread, so the simulation takes no CPU from compute. Every other
// collective goes to the real group underneath.
#pragma once

#include <memory>

#include "comm/process_group.h"

namespace rg::dist {

struct SimLink {
  double gbps = 1.0;         // GB/s (1e9 bytes per second)
  double latency_us = 50.0;  // per collective
};

// "GBPS,LATENCY_US" (e.g. "1,50"); rg::Error otherwise.
SimLink parse_sim_link(const std::string& spec);

class SimulatedLinkGroup : public ProcessGroup {
 public:
  SimulatedLinkGroup(std::shared_ptr<ProcessGroup> real, SimLink link);
  ~SimulatedLinkGroup() override;

  const char* backend() const override { return "simulated-link"; }
  WorkPtr all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum) override;
  WorkPtr broadcast(const Tensor& tensor, int root) override;
  WorkPtr all_gather(const Tensor& output, const Tensor& input) override;
  WorkPtr reduce_scatter(const Tensor& output, const Tensor& input,
                         ReduceOp op = ReduceOp::sum) override;
  WorkPtr barrier() override;
  WorkPtr send(const Tensor& tensor, int dst, uint32_t tag = 0) override;
  WorkPtr recv(const Tensor& tensor, int src, uint32_t tag = 0) override;

 private:
  struct Impl;
  std::shared_ptr<ProcessGroup> real_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rg::dist
