// Automatic mixed precision, as torch.autocast: inside an AutocastGuard for a device type, the ops
// on PyTorch's lower-precision list run in f16 or bf16 and those on its f32 list run in f32,
// whatever the dtype of their inputs; the others follow their inputs (binary ops promote mixed
// floating inputs to the wider type). Parameters stay f32 ("master weights"): the casts are
// differentiable, so their gradients arrive in f32.
//
//   lower precision (the guard's dtype): conv2d, linear, matmul, causal_attention
//   f32:    softmax, log_softmax, nll_loss, cross_entropy, mse_loss, smooth_l1_loss, sum, exp,
//           log, pow, layer_norm
//   follow: everything else (relu, pooling, dropout, batch_norm, add, mean, ...); add, sub, mul
//           and div with mixed floating inputs run in the wider dtype
//
// The lists are PyTorch's CUDA autocast lists restricted to ringgrad's ops, used on both devices
// (PyTorch 1.13's CPU list keeps softmax, log_softmax and sum in the input's dtype; ours runs them
// in f32 there too). f64 tensors are never cast, as in PyTorch. State is per thread and per device
// type; guards nest and restore what they found. Backward runs with autocast off (every backward
// op takes the dtype of its forward), as PyTorch recommends.
#pragma once

#include "engine/device.h"
#include "engine/dtype.h"

namespace rg {

class AutocastGuard {
 public:
  // Autocast on `device` (its type: every CUDA device, or the CPU) in `dtype`, which must be f16
  // or bf16 (rg::Error otherwise); enabled = false turns it off in the scope.
  AutocastGuard(DeviceType device, DType dtype, bool enabled = true);
  explicit AutocastGuard(Device device, DType dtype, bool enabled = true)
      : AutocastGuard(device.type, dtype, enabled) {}
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType device_;
  bool prev_enabled_;
  DType prev_dtype_;
};

// Autocast off on every device type in a scope (the autograd engine runs backward so).
class NoAutocastGuard {
 public:
  NoAutocastGuard();
  ~NoAutocastGuard();
  NoAutocastGuard(const NoAutocastGuard&) = delete;
  NoAutocastGuard& operator=(const NoAutocastGuard&) = delete;

 private:
  bool prev_cpu_, prev_cuda_;
};

bool autocast_enabled(DeviceType device);
// The lower-precision dtype of `device`'s autocast: the innermost guard's, else PyTorch's
// defaults (f16 on CUDA, bf16 on the CPU).
DType autocast_dtype(DeviceType device);

}  // namespace rg
