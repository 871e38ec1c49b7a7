// SimulatedLinkGroup: a ProcessGroup whose all-reduces take the time a network link of a given
// bandwidth and latency would need, so all-reduce/backward overlap can be studied on one
// machine. The simulated all-reduce moves no data (each rank keeps its own values: use it for
// timing only); it completes latency + busbytes / bandwidth after the link becomes free, where
// busbytes = bytes * 2(n-1)/n as for a ring among n ranks (the group's size, or SimLink::ranks),
// and the link carries one collective at a time. CPU tensors: waiting is a sleep on a timer
// thread, so the simulation takes no CPU from compute. CUDA tensors over an NCCL group: the
// modelled transfer occupies the group's communication stream (a host function that sleeps, after
// the tensor's producers on the current stream), shows on the trace as the NCCL stream's span, and
// takes no SM from the kernels; Work::wait orders the current stream after it, as NCCL's does.
// Every other collective goes to the real group underneath.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "comm/process_group.h"

namespace rg::dist {

struct SimLink {
  SimLink() = default;
  SimLink(double gbps_, double latency_us_, int ranks_ = 0, std::string name_ = "")
      : gbps(gbps_), latency_us(latency_us_), ranks(ranks_), name(std::move(name_)) {}
  double gbps = 1.0;         // GB/s (1e9 bytes per second)
  double latency_us = 50.0;  // per collective
  int ranks = 0;             // the ring's size in the model; 0: the group's size
  std::string name;          // the preset's name, or empty

  // Microseconds for one all-reduce of `bytes` among n ranks: latency + 2(n-1)/n * bytes /
  // bandwidth; 0 for a single rank (nothing to exchange). ringgrad-bench scale's flat link model.
  double allreduce_us(double bytes, int n) const;
  std::string describe() const;  // "450 GB/s + 2 us per all-reduce (nvlink-h100)"
};

// "GBPS,LATENCY_US" (e.g. "1,50", or with units "450GBps,2us"), or a preset name (see
// sim_link_presets_help); rg::Error otherwise.
SimLink parse_sim_link(const std::string& spec);
// The presets with their figures and sources, for --help.
std::string sim_link_presets_help();

class SimulatedLinkGroup : public ProcessGroup {
 public:
  SimulatedLinkGroup(std::shared_ptr<ProcessGroup> real, SimLink link);
  ~SimulatedLinkGroup() override;

  const char* backend() const override { return "simulated-link"; }
  Device tensor_device() const override { return real_->tensor_device(); }
  WorkPtr all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum) override;
  WorkPtr broadcast(const Tensor& tensor, int root) override;
  WorkPtr all_gather(const Tensor& output, const Tensor& input) override;
  WorkPtr reduce_scatter(const Tensor& output, const Tensor& input,
                         ReduceOp op = ReduceOp::sum) override;
  WorkPtr barrier() override;
  WorkPtr send(const Tensor& tensor, int dst, uint32_t tag = 0) override;
  WorkPtr recv(const Tensor& tensor, int src, uint32_t tag = 0) override;

  // While free, an all-reduce completes at once: no transfer, no time, nothing queued on a
  // stream. A DDP iteration then costs what it would on an infinitely fast link (its hooks,
  // bucket copies and final callback included), which is what ringgrad-bench overlap's step
  // profiles measure for ringgrad-bench scale. Set it between iterations, not during one.
  void set_free(bool free);

 private:
  struct Impl;
  std::shared_ptr<ProcessGroup> real_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rg::dist
