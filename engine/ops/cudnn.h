// The switch between cuDNN and our own CUDA kernels for the ops that have both (batch_norm,
// avg_pool2d), like torch.backends.cudnn.enabled.
#pragma once

namespace rg {

// On by default. Off, batch norm and average pooling on CUDA run our own kernels, the checked
// fallback that also serves what cuDNN does not take. conv2d has no other CUDA path and always
// uses cuDNN.
void set_cudnn_enabled(bool enabled);
bool cudnn_enabled();

}  // namespace rg
