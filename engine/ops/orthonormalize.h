// orthonormalize_columns_: Gram-Schmidt on the columns of a small matrix, in place (PowerSGD's
// P factors, as torch.linalg.qr's Q would be). Not differentiable.
#pragma once

#include "engine/tensor.h"

namespace rg {

// p: a 2-D f32/f64 tensor [n, r] on any device. Its columns become orthonormal (modified
// Gram-Schmidt computed in f64, two passes); a column that is numerically a combination of the
// earlier ones becomes zero. Returns p.
const Tensor& orthonormalize_columns_(const Tensor& p);

}  // namespace rg
