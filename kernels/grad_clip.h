// The gradient clipping kernels (layers/clip_grad.h), one contract for both backends
// (kernels/backend.h): the p-norm of several tensors taken together, accumulated tensor by tensor
// into one f64 value on the device so no host round trip is needed per tensor, the in-place scaling
// by the clip coefficient read from that norm on the device, and the in-place clamp.
// kernels/cpu/grad_clip.cpp defines GradClip<Cpu> (f32, f64), kernels/cuda/grad_clip.cu
// GradClip<Cuda> (f32, f64, f16, bf16; the half types compute in f32).
//
// Shared rules: |x|^p is evaluated in f64 and summed over kNormBlocks contiguous chunks of each
// tensor, then the chunks in order (so a norm does not depend on the thread count or timing); the
// infinity norm is the largest |x|. NaN propagates through both, so a NaN gradient gives a NaN
// norm.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

template <class B>
struct GradClip {
  static constexpr int64_t kNormBlocks = 64;
  // Scratch bytes norm_accumulate needs (the f64 partial values).
  static int64_t norm_workspace_bytes(int64_t) {
    return kNormBlocks * static_cast<int64_t>(sizeof(double));
  }
  // acc[0] (one f64 on the device) += sum_i |x[i]|^p for finite p, or = max(acc[0], max_i |x[i]|)
  // for p == inf.
  template <class T>
  static void norm_accumulate(const T* x, int64_t n, double p, double* acc, Workspace workspace,
                              Ctx ctx);
  // out[0] = acc[0]^(1/p) (acc[0] itself for p == 1 and p == inf, sqrt for p == 2).
  template <class T>
  static void norm_finish(const double* acc, double p, T* out, Ctx ctx);
  // x[i] *= min(max_norm / (total_norm[0] + 1e-6), 1), the coefficient computed in the compute
  // type (f32 for f32 and the half types) as torch.nn.utils.clip_grad_norm_ does; a NaN norm makes
  // every x[i] NaN.
  template <class T>
  static void scale_by_clip_coef(T* x, int64_t n, const T* total_norm, double max_norm, Ctx ctx);
  // x[i] = min(max(x[i], lo), hi); NaN stays NaN.
  template <class T>
  static void clamp(T* x, int64_t n, double lo, double hi, Ctx ctx);
};

namespace detail {

// Orders 1, 2, any other finite p > 0, and inf.
inline void check_norm_type(const char* op, double p) {
  RG_CHECK(p > 0.0, op, ": norm_type must be > 0 (or inf), got ", p);
}
inline void check_clip_size(const char* op, int64_t n) {
  RG_CHECK(n >= 0, op, ": element count must be >= 0, got ", n);
}

}  // namespace detail
}  // namespace rg::kernels
