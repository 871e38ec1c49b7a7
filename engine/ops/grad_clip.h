// The ops behind gradient clipping (layers/clip_grad.h): the p-norm of several tensors taken
// together, the in-place scaling by clip_grad_norm_'s coefficient read from that norm on the
// device, and an in-place clamp. None is recorded by autograd; the in-place ones refuse a tensor
// that requires grad while grad mode is on, as add_ does.
#pragma once

#include <vector>

#include "engine/tensor.h"

namespace rg {

// The norm of order p (> 0, or inf) of every element of `tensors` as one vector, as
// torch.linalg.vector_norm of their concatenation: (sum |x|^p)^(1/p), max |x| for inf. The
// tensors share one device and one floating dtype; the result is a 0-d tensor of that dtype and
// device, accumulated in f64 without a host round trip; NaN elements give NaN. Needs at least one
// tensor.
Tensor total_norm(const std::vector<Tensor>& tensors, double norm_type = 2.0);

// x *= min(max_norm / (total_norm + 1e-6), 1), in place, with the coefficient computed on x's
// device in the compute type (torch.nn.utils.clip_grad_norm_'s clip_coef_clamped). total_norm
// is a one-element tensor with x's device and dtype; max_norm >= 0.
Tensor& scale_by_clip_coef_(Tensor& x, const Tensor& total_norm, double max_norm);

// x = min(max(x, min), max), in place (min <= max, neither NaN); NaN elements stay NaN.
Tensor& clamp_(Tensor& x, double min, double max);

}  // namespace rg
