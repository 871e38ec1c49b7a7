// Optim<Cuda> (kernels/optim.h), fused SGD and Adam/AdamW kernels: each element's parameter,
// gradient and state are read and written once per step. The flags are uniform across the grid, so
// the branches do not diverge.
#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/cuda/optim.h"
#include "kernels/error.h"
#include "kernels/optim.h"

namespace rg::kernels::cuda {
namespace {

using namespace detail;

// Hyperparameters in the compute type A, as kernels/cpu/optim.cpp computes them.
template <class A>
struct SgdArgs {
  A lr, momentum, damp, weight_decay;  // damp = 1 - dampening
  bool has_weight_decay, has_momentum, nesterov, first_step;
  const A* replay = nullptr;    // lr in device memory (a graph's)
  const float* skip = nullptr;  // nonzero: no update (GradScaler's found-inf)
#if defined(RG_CUDA_EMU)
  static constexpr int kReplayValues = 1;  // what the race detector sees read at `replay`
#endif
};

template <class A>
struct AdamArgs {
  A step_size, inv_sqrt_bc2, beta1, beta2, eps, weight_decay, decay;  // decay = 1 - lr * wd
  bool has_weight_decay, decoupled;
  const A* replay = nullptr;  // step_size, inv_sqrt_bc2 and decay in device memory (a graph's)
  const double* computed = nullptr;  // the same as f64, from the device's step counts
  const float* skip = nullptr;       // nonzero: no update (GradScaler's found-inf)
#if defined(RG_CUDA_EMU)
  static constexpr int kReplayValues = 3;  // what the race detector sees read at `replay`
#endif
};

// One element's updates, shared by the one-tensor and the multi-tensor kernels (so both round
// alike).
template <class D>
__device__ __forceinline__ void sgd_element(D* p, const D* g, D* buf, int64_t i,
                                            const SgdArgs<compute_t<D>>& s) {
  using A = compute_t<D>;
  const A pi = load(p[i]);
  A d = load(g[i]);
  if (s.has_weight_decay) d += s.weight_decay * pi;
  if (s.has_momentum) {
    const A b = s.first_step ? d : s.momentum * load(buf[i]) + s.damp * d;
    buf[i] = store<D>(b);
    d = s.nesterov ? d + s.momentum * b : b;
  }
  p[i] = store<D>(pi - (s.replay ? *s.replay : s.lr) * d);
}

template <class D>
__device__ __forceinline__ void adam_element(D* p, const D* g, D* m, D* v, int64_t i,
                                             const AdamArgs<compute_t<D>>& a) {
  using A = compute_t<D>;
  const A step_size = a.replay ? a.replay[0] : a.computed ? A(a.computed[0]) : a.step_size;
  const A inv_sqrt_bc2 = a.replay ? a.replay[1] : a.computed ? A(a.computed[1]) : a.inv_sqrt_bc2;
  A pi = load(p[i]);
  A grad = load(g[i]);
  if (a.has_weight_decay) {
    if (a.decoupled) {
      pi *= a.replay ? a.replay[2] : a.computed ? A(a.computed[2]) : a.decay;
    } else {
      grad += a.weight_decay * pi;
    }
  }
  const A mi = a.beta1 * load(m[i]) + (A(1) - a.beta1) * grad;
  const A vi = a.beta2 * load(v[i]) + (A(1) - a.beta2) * grad * grad;
  m[i] = store<D>(mi);
  v[i] = store<D>(vi);
  const A denom = sqrt_(vi) * inv_sqrt_bc2 + a.eps;
  p[i] = store<D>(pi - step_size * mi / denom);
}

template <class D>
__global__ void sgd_kernel(D* p, const D* g, D* buf, int64_t n, SgdArgs<compute_t<D>> s) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) sgd_element(p, g, buf, i, s);
}

template <class D>
__global__ void adam_kernel(D* p, const D* g, D* m, D* v, int64_t n, AdamArgs<compute_t<D>> a) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) adam_element(p, g, m, v, i, a);
}

// Up to kMaxTensors parameters of one launch, passed by value as the kernel's parameter (under
// 4 KiB for every dtype): blockIdx.y picks the tensor, x strides over its elements.
constexpr int kMaxTensors = 24;

template <class D, class Args>
struct TensorList {
  int count = 0;
  D* p[kMaxTensors];
  const D* g[kMaxTensors];
  D* s1[kMaxTensors];
  D* s2[kMaxTensors];
  int64_t n[kMaxTensors];
  Args args[kMaxTensors];
#if defined(RG_CUDA_EMU)
  // What the emulator's race detector would otherwise not see: the pointers inside the list.
  void append_accesses(std::vector<::rg::emu::MemAccess>& out) const {
    for (int t = 0; t < count; ++t) {
      out.push_back({p[t], ::rg::emu::kToBlockEnd, true});
      out.push_back({g[t], ::rg::emu::kToBlockEnd, false});
      if (s1[t]) out.push_back({s1[t], ::rg::emu::kToBlockEnd, true});
      if (s2[t]) out.push_back({s2[t], ::rg::emu::kToBlockEnd, true});
      if (args[t].replay)
        out.push_back({args[t].replay, Args::kReplayValues * sizeof(*args[t].replay), false});
      if constexpr (requires { args[t].skip; })
        if (args[t].skip) out.push_back({args[t].skip, sizeof(float), false});
      if constexpr (requires { args[t].computed; })
        if (args[t].computed) out.push_back({args[t].computed, 3 * sizeof(double), false});
    }
  }
#endif
};

template <class D>
__global__ void sgd_many_kernel(TensorList<D, SgdArgs<compute_t<D>>> list) {
  const int t = int(blockIdx.y);
  if (list.args[t].skip != nullptr && *list.args[t].skip != 0.0f) return;  // uniform per block
  const int64_t n = list.n[t];
  for (int64_t i = grid_start(); i < n; i += grid_stride())
    sgd_element(list.p[t], list.g[t], list.s1[t], i, list.args[t]);
}

template <class D>
__global__ void adam_many_kernel(TensorList<D, AdamArgs<compute_t<D>>> list) {
  const int t = int(blockIdx.y);
  if (list.args[t].skip != nullptr && *list.args[t].skip != 0.0f) return;  // uniform per block
  const int64_t n = list.n[t];
  for (int64_t i = grid_start(); i < n; i += grid_stride())
    adam_element(list.p[t], list.g[t], list.s1[t], list.s2[t], i, list.args[t]);
}

// Adam's step counts on the device (kernels/cuda/optim.h): one thread per listed parameter.
__global__ void adam_count_steps_kernel(AdamStepList list, int64_t* counts, double* values,
                                        const double* weight_decay, const double* table,
                                        int64_t last, const double* lr, const float* skip) {
  const int t = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= list.count) return;
  const int32_t i = list.index[t];
  int64_t c = counts[i];
  if (skip == nullptr || *skip == 0.0f) counts[i] = ++c;
  const int64_t k = c < last ? c : last;
  const double l = *lr;
  // As the host computes them: lr / bc1 (IEEE division), 1 - lr * wd rounded twice (no FMA).
  values[3 * i] = l / table[2 * k];
  values[3 * i + 1] = table[2 * k + 1];
  values[3 * i + 2] = __dadd_rn(1.0, -__dmul_rn(l, weight_decay[i]));
}

// Each thread of a list's launch strides over about this many elements of the list's largest
// tensor, so that its smaller tensors leave fewer blocks with nothing to do (PyTorch's
// multi_tensor_apply gives a thread 128). The results do not depend on it: every element is
// updated alone.
constexpr int64_t kManyElementsPerThread = 16;

// Launches `kernel` over `updates` in lists of at most kMaxTensors, skipping empty tensors; args(u)
// gives a tensor's hyperparameters.
template <class D, class Args, class T, class MakeArgs>
void launch_many(void (*kernel)(TensorList<D, Args>), const ParamUpdate<T>* updates, int64_t count,
                 MakeArgs&& args, void* stream, const char* name) {
  TensorList<D, Args> list;
  int64_t largest = 0;
  auto flush = [&] {
    if (list.count == 0) return;
    const dim3 grid(blocks_for((largest + kManyElementsPerThread - 1) / kManyElementsPerThread),
                    unsigned(list.count));
    RG_LAUNCH(kernel, grid, kThreads, 0, as_stream(stream), list);
    list.count = 0;
    largest = 0;
  };
  for (int64_t i = 0; i < count; ++i) {
    const ParamUpdate<T>& u = updates[i];
    RG_CHECK(u.n >= 0, name, ": element count must be >= 0, got ", u.n);
    if (u.n == 0) continue;
    const int t = list.count++;
    list.p[t] = dev(u.p);
    list.g[t] = dev(u.g);
    list.s1[t] = dev(u.state1);
    list.s2[t] = dev(u.state2);
    list.n[t] = u.n;
    list.args[t] = args(u);
    largest = std::max(largest, u.n);
    if (list.count == kMaxTensors) flush();
  }
  flush();
}

}  // namespace
}  // namespace rg::kernels::cuda

namespace rg::kernels {

template <>
template <class T>
void Optim<Cuda>::sgd_step(T* p, const T* g, T* buf, int64_t n, const SgdParams& params,
                           bool first_step, Ctx ctx) {
  using namespace cuda::detail;
  using cuda::SgdArgs;
  kernels::detail::check_sgd(n, params, buf);
  void* stream = ctx.stream;
  if (n == 0) return;
  using D = device_t<T>;
  using A = compute_t<D>;
  const SgdArgs<A> s{A(params.lr),
                     A(params.momentum),
                     A(1.0 - params.dampening),
                     A(params.weight_decay),
                     params.weight_decay != 0,
                     params.momentum != 0,
                     params.nesterov,
                     first_step};
  RG_LAUNCH(cuda::sgd_kernel<D>, blocks_for(n), kThreads, 0, as_stream(stream), dev(p), dev(g),
            dev(buf), n, s);
}

template <>
template <class T>
void Optim<Cuda>::adam_step(T* p, const T* g, T* m, T* v, int64_t n, const AdamParams& params,
                            int64_t step, Ctx ctx) {
  using namespace cuda::detail;
  using cuda::AdamArgs;
  kernels::detail::check_adam(n, step);
  void* stream = ctx.stream;
  if (n == 0) return;
  using D = device_t<T>;
  using A = compute_t<D>;
  const double bc1 = 1.0 - std::pow(params.beta1, double(step));
  const double bc2 = 1.0 - std::pow(params.beta2, double(step));
  const AdamArgs<A> a{A(params.lr / bc1),
                      A(1.0 / std::sqrt(bc2)),
                      A(params.beta1),
                      A(params.beta2),
                      A(params.eps),
                      A(params.weight_decay),
                      A(1.0 - params.lr * params.weight_decay),
                      params.weight_decay != 0,
                      params.decoupled_weight_decay};
  RG_LAUNCH(cuda::adam_kernel<D>, blocks_for(n), kThreads, 0, as_stream(stream), dev(p), dev(g),
            dev(m), dev(v), n, a);
}

template <>
template <class T>
void Optim<Cuda>::sgd_step_many(const ParamUpdate<T>* updates, int64_t count,
                                const SgdParams& params, Ctx ctx) {
  using namespace cuda::detail;
  using D = device_t<T>;
  using A = compute_t<D>;
  for (int64_t i = 0; i < count; ++i) {
    SgdParams s = params;
    s.weight_decay = updates[i].weight_decay;
    kernels::detail::check_sgd(updates[i].n, s, updates[i].state1);
  }
  cuda::launch_many(
      cuda::sgd_many_kernel<D>, updates, count,
      [&](const ParamUpdate<T>& u) {
        return cuda::SgdArgs<A>{
            A(params.lr),      A(params.momentum),  A(1.0 - params.dampening),
            A(u.weight_decay), u.weight_decay != 0, params.momentum != 0,
            params.nesterov,   u.first_step,        static_cast<const A*>(u.replay_values),
            u.skip_if};
      },
      ctx.stream, "sgd_step_many");
}

template <>
template <class T>
void Optim<Cuda>::adam_step_many(const ParamUpdate<T>* updates, int64_t count,
                                 const AdamParams& params, Ctx ctx) {
  using namespace cuda::detail;
  using D = device_t<T>;
  using A = compute_t<D>;
  for (int64_t i = 0; i < count; ++i) {
    kernels::detail::check_adam(updates[i].n, updates[i].step);
    RG_CHECK(updates[i].skip_if == nullptr || updates[i].device_values != nullptr,
             "adam_step_many: a device-side skip flag needs the step counts on the device "
             "(device_values)");
  }
  cuda::launch_many(
      cuda::adam_many_kernel<D>, updates, count,
      [&](const ParamUpdate<T>& u) {
        const double bc1 = 1.0 - std::pow(params.beta1, double(u.step));
        const double bc2 = 1.0 - std::pow(params.beta2, double(u.step));
        return cuda::AdamArgs<A>{A(params.lr / bc1),
                                 A(1.0 / std::sqrt(bc2)),
                                 A(params.beta1),
                                 A(params.beta2),
                                 A(params.eps),
                                 A(u.weight_decay),
                                 A(1.0 - params.lr * u.weight_decay),
                                 u.weight_decay != 0,
                                 params.decoupled_weight_decay,
                                 static_cast<const A*>(u.replay_values),
                                 u.device_values,
                                 u.skip_if};
      },
      ctx.stream, "adam_step_many");
}

void cuda::adam_count_steps(const AdamStepList& list, int64_t* counts, double* values,
                            const double* weight_decay, const double* table, int64_t last,
                            const double* lr, const float* skip, void* stream) {
  RG_CHECK(list.count >= 0 && list.count <= AdamStepList::kMax, "adam_count_steps: list of ",
           list.count, " parameters");
  RG_CHECK(last >= 1, "adam_count_steps: the table needs entries 0 to >= 1, got last ", last);
  if (list.count == 0) return;
  using namespace cuda::detail;
  RG_LAUNCH(cuda::adam_count_steps_kernel, unsigned((list.count + 255) / 256), 256, 0,
            as_stream(stream), list, counts, values, weight_decay, table, last, lr, skip);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_optim_kernels() {
  using K = Optim<Cuda>;
  return std::tuple{&K::sgd_step<T>, &K::adam_step<T>, &K::sgd_step_many<T>, &K::adam_step_many<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_optim_kernels)

}  // namespace rg::kernels
