// Gradient clipping with torch.nn.utils' semantics: clip_grad_norm_ scales every gradient by
// max_norm / (total_norm + 1e-6) when that is below 1, clip_grad_value_ clamps each element to
// [-clip_value, clip_value]. Call them after backward (with DDP: on the averaged gradients, once
// backward has returned) and, with a GradScaler, after scaler.unscale_(optimizer):
//
//   scaler.scale(loss).backward();
//   scaler.unscale_(*opt);                                  // the step will not unscale again
//   nn::utils::clip_grad_norm_(model->parameters(), 1.0);
//   scaler.step(*opt);
//
// The norm stays on the gradients' device (one f64 accumulation per device and dtype, no host
// round trip per parameter); only error_if_nonfinite reads it back.
#pragma once

#include <vector>

#include "engine/tensor.h"

namespace rg::nn::utils {

// The norm of order norm_type (> 0, or inf) of all gradients of `parameters` taken together
// (parameters without a gradient are skipped); each gradient is multiplied in place by
// min(max_norm / (total_norm + 1e-6), 1). Returns the total norm, a 0-d tensor on the first
// gradient's device with its dtype (0.0 on the CPU when there is no gradient). Gradients on
// several devices or of several dtypes: a norm per (device, dtype) group, then the norm of those
// norms on the first one's device and dtype, as PyTorch. A NaN or infinite total norm is an error
// when error_if_nonfinite, else the gradients are scaled by it (becoming NaN) as in PyTorch.
// Differences from PyTorch: max_norm must be >= 0 and not NaN, and norm_type 0 and -inf are not
// supported (clear errors).
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

// Clamps every gradient element of `parameters` to [-clip_value, clip_value] in place (NaN stays
// NaN); parameters without a gradient are skipped. clip_value must be >= 0 and not NaN (PyTorch
// accepts a negative one and then sets every element to it).
void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value);

}  // namespace rg::nn::utils
