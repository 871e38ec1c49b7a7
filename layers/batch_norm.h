// BatchNorm2d with torchvision's parameter and buffer names (weight, bias, running_mean,
// running_var, num_batches_tracked) and PyTorch's momentum/eps defaults; synchronized across
// processes, it is SyncBatchNorm (layers/sync_batch_norm.h).
#pragma once

#include <memory>

#include "engine/ops/sync_batch_norm.h"
#include "layers/module.h"

namespace rg::nn {

// Whether BatchNorm2d::forward_relu and forward_add_relu fuse (on by default); off, they are
// relu(forward(x)) and relu(forward(x) + residual), for comparing the two (ringgrad-bench train
// --fuse-bn-relu false).
void set_batch_norm_relu_fusion(bool on);
bool batch_norm_relu_fusion();

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1);
  Tensor forward_impl(const Tensor& x) override;
  // relu(forward(x)), as one op (batch_norm_relu: one pass over the activation less, no saved
  // output) unless something could tell: a hook on this module (it sees the batch norm's own
  // output) or a SyncBatchNorm. The same values either way (tests/device/
  // batch_norm_relu_device_test.cpp), within f32 rounding where f32 would take cuDNN unfused.
  Tensor forward_relu(const Tensor& x);
  // relu(forward(x) + residual) (a ResNet block's end), as one op (batch_norm_add_relu) under
  // the same conditions as forward_relu, and when the residual has x's shape and dtype (else the
  // add broadcasts or promotes, unfused).
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual);
  std::string type_name() const override { return sync_ ? "SyncBatchNorm" : "BatchNorm2d"; }
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

  // Makes this layer a SyncBatchNorm in place (convert_sync_batchnorm): in training, statistics
  // over every replica's batch through `collectives`, or, when null, the default ones
  // (default_batch_norm_collectives(), set by dist::init_process_group). In place because a
  // C++ parent calls its children through typed members (ResNet's bn1_), which a replacement
  // object would not reach; parameters, buffers and names stay as they are.
  void synchronize(std::shared_ptr<BatchNormCollectives> collectives = nullptr);
  bool synchronized() const { return sync_; }

 protected:
  std::string extra_repr() const override;

 private:
  // The input check and, in training, the batch count: what every forward does first.
  void begin_forward(const Tensor& x);
  int64_t features_;
  double eps_, momentum_;
  bool sync_ = false;
  std::shared_ptr<BatchNormCollectives> collectives_;
};

}  // namespace rg::nn
