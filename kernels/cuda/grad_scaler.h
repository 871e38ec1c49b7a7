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

// *inv_scale = 1 / *scale, in f64 rounded to f32 once (as GradScaler computes it on the host).
void inverse_scale(const float* scale, float* inv_scale, void* stream);

// GradScaler::update on the device (PyTorch's _amp_update_scale_), so the scale never goes to
// the host: *found_inf != 0 (a gradient overflowed in this iteration): scale *= backoff_factor,
// tracker = 0; else ++tracker, and at growth_interval scale *= growth_factor (kept when that is
// not finite in f32) and tracker = 0. Products in f64, rounded to f32 once, as on the host.
void update_scale(float* scale, int64_t* growth_tracker, const float* found_inf,
                  double growth_factor, double backoff_factor, int64_t growth_interval,
                  void* stream);

}  // namespace rg::kernels::cuda
