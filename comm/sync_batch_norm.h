// SyncBatchNorm's two collectives (engine/ops/sync_batch_norm.h) over a ProcessGroup: Gloo on the
// CPU, NCCL on the group's device, tensors elsewhere going through copies.
#pragma once

#include <memory>

#include "comm/process_group.h"
#include "engine/ops/sync_batch_norm.h"
#include "layers/module.h"

namespace rg::dist {

class ProcessGroupBatchNormCollectives final : public BatchNormCollectives {
 public:
  explicit ProcessGroupBatchNormCollectives(std::shared_ptr<ProcessGroup> group);
  int size() const override { return group_->size(); }
  Tensor all_gather(const Tensor& local) override;
  void all_reduce_sum(const Tensor& t) override;

 private:
  std::shared_ptr<ProcessGroup> group_;
};

// nn::convert_sync_batchnorm over `group`: every BatchNorm2d in `module` becomes a SyncBatchNorm
// whose collectives run on that group, in issue order with its other collectives (DDP's buckets).
// Returns how many layers it converted.
int64_t convert_sync_batchnorm(nn::Module& module, std::shared_ptr<ProcessGroup> group);

}  // namespace rg::dist
