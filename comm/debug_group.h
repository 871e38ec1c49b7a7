// DebugProcessGroup: the layer every process group made by make_process_group goes through (as
// PyTorch's ProcessGroupWrapper, but always present). It numbers the group's calls, records each
// in the flight recorder (comm/flight_recorder.h) with its enqueue, start and end, and dumps the
// recorder when a call fails. With RG_DISTRIBUTED_DEBUG=DETAIL it also checks, before every
// collective, that every rank is making the same call (the CollectiveCall fingerprint: group,
// sequence number, collective, reduce op, root, dtype, shapes) through the job's store, a side
// channel that does not depend on the collective itself, so a mismatch cannot deadlock it: a
// mismatch is an rg::Error on every rank naming the sequence number, each rank's call and which
// ranks differ; a rank that never arrives is named when the group's timeout runs out. A receive
// is checked against its sender's call (the k-th send from that rank with that tag).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "comm/collective_call.h"
#include "comm/process_group.h"
#include "comm/store.h"

namespace rg::dist {

class DebugProcessGroup final : public ProcessGroup {
 public:
  // `store` carries the DETAIL fingerprints (under "rg.debug/<group name>/<k>", k counting the
  // groups of that name this process made, the same on every rank that makes them in order).
  DebugProcessGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<Store> store);

  const char* backend() const override { return inner_->backend(); }
  Device tensor_device() const override { return inner_->tensor_device(); }
  ProcessGroup& backend_group() override { return inner_->backend_group(); }
  void set_algorithm(Algorithm a) override;

  WorkPtr all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum) override;
  WorkPtr broadcast(const Tensor& tensor, int root) override;
  WorkPtr all_gather(const Tensor& output, const Tensor& input) override;
  WorkPtr reduce_scatter(const Tensor& output, const Tensor& input,
                         ReduceOp op = ReduceOp::sum) override;
  WorkPtr barrier() override;
  WorkPtr send(const Tensor& tensor, int dst, uint32_t tag = 0) override;
  WorkPtr recv(const Tensor& tensor, int src, uint32_t tag = 0) override;

  // Collectives issued so far (the last one's sequence number).
  uint64_t sequence_number() const;

 private:
  CollectiveCall make_call(const char* op, std::vector<const Tensor*> tensors) const;
  // Numbers, records, checks (DETAIL) and issues one call; `issue` hands it to the backend.
  WorkPtr run(CollectiveCall call, const std::function<WorkPtr()>& issue);
  void check_collective(const CollectiveCall& call);
  void check_p2p(const CollectiveCall& call, int src, int dst);
  [[noreturn]] void fail(uint64_t id, const std::string& message);

  std::shared_ptr<ProcessGroup> inner_;
  std::shared_ptr<Store> store_;  // prefixed for this group's fingerprints
  std::string name_;              // the group's name in records ("default", "default#1", ...)
  mutable std::mutex mu_;         // calls are numbered and checked one at a time
  uint64_t seq_ = 0;
  std::map<std::tuple<int, int, uint32_t>, uint64_t> p2p_seq_;  // (src, dst, tag) -> count
};

}  // namespace rg::dist
