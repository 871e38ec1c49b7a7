// CUDA part of Adam's steps that the device may skip (GradScaler's f16 steps decided on the
// device, layers/optim/optimizer.h): the step counts live in device memory, and a kernel counts
// them and computes each parameter's bias-corrected values for Optim<Cuda>::adam_step_many
// (ParamUpdate::device_values). Plain C++ header: `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

namespace rg::kernels::cuda {

// Parameter indexes into the arrays of adam_count_steps (passed by value to the kernel).
struct AdamStepList {
  static constexpr int kMax = 512;
  int count = 0;
  int32_t index[kMax];
};

// For each listed parameter i: unless *skip != 0 (skip may be null), ++counts[i]; then with
// c = counts[i] and k = min(c, last): values[3i..3i+2] = {*lr / table[2k], table[2k+1],
// 1 - *lr * weight_decay[i]}, where table[2t] = 1 - beta1^t and table[2t+1] = 1/sqrt(1 -
// beta2^t) as the host computes them, and both are exactly 1 from t = last on. In f64 with the
// host's roundings, so the values are the host's bit for bit.
void adam_count_steps(const AdamStepList& list, int64_t* counts, double* values,
                      const double* weight_decay, const double* table, int64_t last,
                      const double* lr, const float* skip, void* stream);

}  // namespace rg::kernels::cuda
