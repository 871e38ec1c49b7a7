// ProcessGroupBatchNormCollectives: blocking collectives (SyncBatchNorm needs their results at
// once, as PyTorch's async_op=False), on the group's device.
#include "comm/sync_batch_norm.h"

#include "kernels/error.h"
#include "layers/sync_batch_norm.h"

namespace rg::dist {

ProcessGroupBatchNormCollectives::ProcessGroupBatchNormCollectives(
    std::shared_ptr<ProcessGroup> group)
    : group_(std::move(group)) {
  RG_CHECK(group_ != nullptr, "SyncBatchNorm: the process group must not be null");
}

Tensor ProcessGroupBatchNormCollectives::all_gather(const Tensor& local) {
  const Tensor in = on_group_device(*group_, local);
  Tensor out = Tensor::empty({group_->size() * local.numel()}, local.dtype(), in.device());
  group_->all_gather(out, in)->wait();
  return out.device() == local.device() ? out : out.to(local.device());
}

void ProcessGroupBatchNormCollectives::all_reduce_sum(const Tensor& t) {
  const Tensor on = on_group_device(*group_, t);
  group_->all_reduce(on, ReduceOp::sum)->wait();
  if (on.device() != t.device()) Tensor(t).copy_(on);
}

int64_t convert_sync_batchnorm(nn::Module& module, std::shared_ptr<ProcessGroup> group) {
  return nn::convert_sync_batchnorm(
      module, std::make_shared<ProcessGroupBatchNormCollectives>(std::move(group)));
}

}  // namespace rg::dist
