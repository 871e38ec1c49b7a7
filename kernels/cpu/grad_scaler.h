// CPU part of the AMP GradScaler: unscale gradients by 1/scale and report whether any is inf or
// NaN, in one pass; the same arithmetic as kernels/cuda/grad_scaler (x * inv_scale in T).
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

// x[i] *= inv_scale (left untouched when inv_scale == 1); returns true when any x[i] was inf or
// NaN. Instantiated for float and double.
template <class T>
bool unscale_check_finite(T* x, int64_t n, float inv_scale);

}  // namespace rg::kernels::cpu
