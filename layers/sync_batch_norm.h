// SyncBatchNorm as torch.nn.SyncBatchNorm: batch norm whose training statistics span every
// process's batch (engine/ops/sync_batch_norm.h), and convert_sync_batchnorm.
#pragma once

#include <memory>

#include "layers/batch_norm.h"

namespace rg::nn {

// A BatchNorm2d synchronized from the start: in training with more than one replica, the
// statistics of the global batch; otherwise (eval mode, one replica, no process group) plain batch
// norm, as PyTorch's. Takes [N, C, H, W] or [N, C] inputs.
class SyncBatchNorm final : public BatchNorm2d {
 public:
  explicit SyncBatchNorm(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                         std::shared_ptr<BatchNormCollectives> collectives = nullptr);
};

// As torch.nn.SyncBatchNorm.convert_sync_batchnorm: every BatchNorm2d in `module` (itself
// included, recursively) becomes a SyncBatchNorm over `collectives` (null: the default ones),
// keeping its parameters, buffers, state and names, so state_dicts and checkpoints still load.
// In place (BatchNorm2d::synchronize says why); returns how many layers it converted (0 for a model
// without batch norm: nothing to do, as in PyTorch).
int64_t convert_sync_batchnorm(Module& module,
                               std::shared_ptr<BatchNormCollectives> collectives = nullptr);

// The collectives of SyncBatchNorm layers that have none of their own, as PyTorch's
// group.WORLD: dist::init_process_group sets them over its default group and
// destroy_process_group clears them. Null: none (such layers are then plain batch norm).
void set_default_batch_norm_collectives(std::shared_ptr<BatchNormCollectives> collectives);
std::shared_ptr<BatchNormCollectives> default_batch_norm_collectives();

}  // namespace rg::nn
