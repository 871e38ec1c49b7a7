// Fused optimizer updates, one contract for both backends (kernels/backend.h), with PyTorch's
// exact update formulas: one pass per element, parameters, gradients and state in one type.
// kernels/cpu/optim.cpp defines Optim<Cpu> (f32, f64), kernels/cuda/optim.cu Optim<Cuda> (f32,
// f64, f16, bf16; the half types compute in f32 and round each stored value once). On both,
// hyperparameters are converted to the compute type once, on the host, the same way.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

struct SgdParams {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
};

struct AdamParams {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled_weight_decay;  // AdamW
};

// One parameter of a multi-tensor step: parameter, gradient, state (SGD: state1 = the momentum
// buffer, null without momentum; Adam: state1 = exp_avg, state2 = exp_avg_sq), element count,
// its weight decay (its parameter group's), and SGD's first_step (its buffer is new) or Adam's
// step number. In a CUDA graph (CUDA only): `replay_values`, when set, points to numbers of the
// compute type in device memory that the host writes before each replay and the kernel reads
// instead of the ones it was launched with (engine/cuda/graph.h's replay slots): SGD's lr; Adam's
// lr / (1 - beta1^step), 1 / sqrt(1 - beta2^step) and 1 - lr * weight_decay. SGD only:
// `skip_if`, when set, is an f32 flag in device memory (CUDA) or host memory (CPU): nonzero, the
// update is skipped (GradScaler's found-inf, read by the kernel instead of the host). Adam on CUDA
// only: `device_values`, when set, points to the three values above as f64 in device memory,
// written by kernels::cuda::adam_count_steps from step counts kept on the device (the host does
// not know whether the device skipped a step); Adam takes `skip_if` only with them.
template <class T>
struct ParamUpdate {
  T* p;
  const T* g;
  T* state1;
  T* state2;
  int64_t n;
  double weight_decay;
  bool first_step;
  int64_t step;
  const void* replay_values = nullptr;
  const float* skip_if = nullptr;
  const double* device_values = nullptr;
};

template <class B>
struct Optim {
  // p -= lr * d, where d = g + wd*p, then momentum: buf = first ? d : momentum*buf +
  // (1-dampening)*d, d = nesterov ? d + momentum*buf : buf. `buf` may be null when momentum == 0.
  template <class T>
  static void sgd_step(T* p, const T* g, T* buf, int64_t n, const SgdParams& params,
                       bool first_step, Ctx ctx);
  // One Adam/AdamW step number `step` (>= 1) with bias correction.
  template <class T>
  static void adam_step(T* p, const T* g, T* m, T* v, int64_t n, const AdamParams& params,
                        int64_t step, Ctx ctx);
  // The same updates for `count` parameters of one dtype in few launches (PyTorch's foreach /
  // multi-tensor apply): on CUDA one launch per kMaxTensorsPerLaunch parameters, on the CPU one
  // call per parameter. Each parameter's weight decay comes from its ParamUpdate (params'
  // weight_decay is ignored). Bit-identical to sgd_step / adam_step per parameter.
  template <class T>
  static void sgd_step_many(const ParamUpdate<T>* updates, int64_t count, const SgdParams& params,
                            Ctx ctx);
  template <class T>
  static void adam_step_many(const ParamUpdate<T>* updates, int64_t count, const AdamParams& params,
                             Ctx ctx);
};

namespace detail {

inline void check_sgd(int64_t n, const SgdParams& params, const void* buf) {
  RG_CHECK(n >= 0, "sgd_step: element count must be >= 0, got ", n);
  RG_CHECK(params.momentum == 0 || buf != nullptr || n == 0, "sgd_step: momentum ", params.momentum,
           " needs a momentum buffer");
}
inline void check_adam(int64_t n, int64_t step) {
  RG_CHECK(n >= 0, "adam_step: element count must be >= 0, got ", n);
  RG_CHECK(step >= 1, "adam_step: step numbers start at 1, got ", step);
}

}  // namespace detail
}  // namespace rg::kernels
