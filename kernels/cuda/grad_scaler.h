// CUDA part of the AMP GradScaler: unscale gradients by 1/scale and note whether any is inf or NaN,
// in one pass (PyTorch's _amp_foreach_non_finite_check_and_unscale_). Plain C++ header: `stream`
// is a cudaStream_t.
#pragma once

#include <cstdint>

namespace rg::kernels::cuda {

// x[i] *= *inv_scale (left untouched when *inv_scale == 1), and *found_inf = 1 when any x[i] was
// inf or NaN. found_inf is only ever set: zero it once per step, then unscale every gradient.
// inv_scale and found_inf are device f32 scalars, so the scale never round-trips to the host.
// Instantiated for float, double, Half and BFloat16 (f16/bf16 multiply in f32 and round once).
template <class T>
void unscale_check_finite(T* x, int64_t n, float* found_inf, const float* inv_scale, void* stream);

}  // namespace rg::kernels::cuda
