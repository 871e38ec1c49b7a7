// BatchNorm2d module: running statistics are buffers, updated by the op in training mode;
// synchronized, the op is sync_batch_norm (as torch.nn.SyncBatchNorm.forward decides).
#include "layers/batch_norm.h"

#include <atomic>

#include "engine/ops/activation.h"
#include "engine/ops/batch_norm.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/sync_batch_norm.h"
#include "kernels/error.h"
#include "layers/sync_batch_norm.h"

namespace rg::nn {

namespace {
std::atomic<bool> g_fuse_relu{true};
}  // namespace

void set_batch_norm_relu_fusion(bool on) { g_fuse_relu = on; }
bool batch_norm_relu_fusion() { return g_fuse_relu; }

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, double momentum)
    : features_(num_features), eps_(eps), momentum_(momentum) {
  RG_CHECK(num_features > 0, "BatchNorm2d: num_features must be positive, got ", num_features);
  weight = register_parameter("weight", ones({num_features}));
  bias = register_parameter("bias", zeros({num_features}));
  running_mean = register_buffer("running_mean", zeros({num_features}));
  running_var = register_buffer("running_var", ones({num_features}));
  num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::i64));
}

void BatchNorm2d::begin_forward(const Tensor& x) {
  // SyncBatchNorm, as PyTorch's, also takes [N, C] inputs.
  RG_CHECK((x.dim() == 4 || (sync_ && x.dim() == 2)) && x.size(1) == features_, type_name(), "(",
           features_, "): expected input [N, ", features_, ", H, W]", sync_ ? " or [N, C]" : "",
           ", got ", shape_str(x.shape()));
  if (is_training()) {
    count_batch_(num_batches_tracked);  // on the device: no read back to the host
  }
}

Tensor BatchNorm2d::forward_relu(const Tensor& x) {
  if (sync_ || has_hooks() || !batch_norm_relu_fusion()) return relu(forward(x));
  return traced_call(x, [this](const Tensor& in) {
    begin_forward(in);
    return batch_norm_relu(in, running_mean, running_var, weight, bias, is_training(), momentum_,
                           eps_);
  });
}

Tensor BatchNorm2d::forward_add_relu(const Tensor& x, const Tensor& residual) {
  // Unfused also where the add would broadcast or promote (autocast's mixed dtypes), which the
  // fused op does not.
  if (sync_ || has_hooks() || !batch_norm_relu_fusion() || residual.shape() != x.shape() ||
      residual.dtype() != x.dtype()) {
    Tensor y = forward(x);
    return relu(add(std::move(y), residual));  // the sum and relu written over y (reusable)
  }
  return traced_call(x, [&](const Tensor& in) {
    begin_forward(in);
    return batch_norm_add_relu(in, residual, running_mean, running_var, weight, bias,
                               is_training(), momentum_, eps_);
  });
}

Tensor BatchNorm2d::forward_impl(const Tensor& x) {
  begin_forward(x);
  if (sync_ && is_training()) {
    // PyTorch's rule: synchronize only in training, with more than one replica; otherwise (no
    // process group, world size 1, eval mode) this is plain batch norm.
    const auto collectives = collectives_ ? collectives_ : default_batch_norm_collectives();
    if (collectives && collectives->size() > 1) {
      return sync_batch_norm(x, running_mean, running_var, weight, bias, momentum_, eps_,
                             collectives);
    }
  }
  return batch_norm(x, running_mean, running_var, weight, bias, is_training(), momentum_, eps_);
}

void BatchNorm2d::synchronize(std::shared_ptr<BatchNormCollectives> collectives) {
  sync_ = true;
  collectives_ = std::move(collectives);
}

std::string BatchNorm2d::extra_repr() const {
  return std::to_string(features_) + ", eps=" + std::to_string(eps_) +
         ", momentum=" + std::to_string(momentum_);
}

}  // namespace rg::nn
