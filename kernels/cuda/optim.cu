// Optim<Cuda> (kernels/optim.h), fused SGD and Adam/AdamW kernels: each element's parameter,
// gradient and state are read and written once per step. The flags are uniform across the grid, so
// the branches do not diverge.
#include <cmath>
#include <tuple>

#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
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
};

template <class A>
struct AdamArgs {
  A step_size, inv_sqrt_bc2, beta1, beta2, eps, weight_decay, decay;  // decay = 1 - lr * wd
  bool has_weight_decay, decoupled;
};

template <class D>
__global__ void sgd_kernel(D* p, const D* g, D* buf, int64_t n, SgdArgs<compute_t<D>> s) {
  using A = compute_t<D>;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const A pi = load(p[i]);
    A d = load(g[i]);
    if (s.has_weight_decay) d += s.weight_decay * pi;
    if (s.has_momentum) {
      const A b = s.first_step ? d : s.momentum * load(buf[i]) + s.damp * d;
      buf[i] = store<D>(b);
      d = s.nesterov ? d + s.momentum * b : b;
    }
    p[i] = store<D>(pi - s.lr * d);
  }
}

template <class D>
__global__ void adam_kernel(D* p, const D* g, D* m, D* v, int64_t n, AdamArgs<compute_t<D>> a) {
  using A = compute_t<D>;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    A pi = load(p[i]);
    A grad = load(g[i]);
    if (a.has_weight_decay) {
      if (a.decoupled) {
        pi *= a.decay;
      } else {
        grad += a.weight_decay * pi;
      }
    }
    const A mi = a.beta1 * load(m[i]) + (A(1) - a.beta1) * grad;
    const A vi = a.beta2 * load(v[i]) + (A(1) - a.beta2) * grad * grad;
    m[i] = store<D>(mi);
    v[i] = store<D>(vi);
    const A denom = sqrt_(vi) * a.inv_sqrt_bc2 + a.eps;
    p[i] = store<D>(pi - a.step_size * mi / denom);
  }
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

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_optim_kernels() {
  using K = Optim<Cuda>;
  return std::tuple{&K::sgd_step<T>, &K::adam_step<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_optim_kernels)

}  // namespace rg::kernels
