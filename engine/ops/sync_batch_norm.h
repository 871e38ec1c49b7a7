// Batch normalization whose statistics span several replicas of a module (torch.nn.SyncBatchNorm's
// function): each replica's batch is one part of a global batch, normalized by its statistics.
#pragma once

#include <memory>

#include "engine/tensor.h"

namespace rg {

// The two collectives a batch norm over several replicas needs. The engine knows nothing of ranks:
// comm/ implements this over a ProcessGroup (dist::ProcessGroupBatchNormCollectives). Every
// replica must call them in the same order, as any collective.
class BatchNormCollectives {
 public:
  virtual ~BatchNormCollectives() = default;
  // The number of replicas.
  virtual int size() const = 0;
  // Every replica's `local` (a 1-d f64 tensor of the same length on each) concatenated in replica
  // order: size() * local.numel() values on local's device.
  virtual Tensor all_gather(const Tensor& local) = 0;
  // In place: `t` (1-d f64) becomes the sum of every replica's.
  virtual void all_reduce_sum(const Tensor& t) = 0;
};

// Training-mode batch_norm (engine/ops/batch_norm.h) of the global batch made of every replica's
// x, as PyTorch's SyncBatchNorm: each replica's per-channel mean, biased variance and count are
// all-gathered (counts may differ; a replica with an empty batch counts 0) and combined into the
// global mean and variance, which normalize x and update running_mean/var (if defined) with the
// unbiased variance over the global count. The backward all-reduces the per-channel sum(dy) and
// sum(dy * xhat) (one collective, when x's gradient is wanted) for the input gradient; the weight
// and bias gradients are this replica's own (DDP averages them). Arguments as batch_norm's.
Tensor sync_batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps,
                       std::shared_ptr<BatchNormCollectives> collectives);

}  // namespace rg
