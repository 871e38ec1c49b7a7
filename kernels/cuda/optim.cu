// Fused SGD and Adam/AdamW kernels: each element's parameter, gradient and state are read and
// written once per step. The flags are uniform across the grid, so the branches do not diverge.
#include <cmath>

#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/cuda/optim.h"
#include "kernels/error.h"

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

template <class T>
void sgd_step(T* p, const T* g, T* buf, int64_t n, const SgdParams& params, bool first_step,
              void* stream) {
  RG_CHECK(n >= 0, "cuda::sgd_step: element count must be >= 0, got ", n);
  RG_CHECK(params.momentum == 0 || buf != nullptr || n == 0, "cuda::sgd_step: momentum ",
           params.momentum, " needs a momentum buffer");
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
  RG_LAUNCH(sgd_kernel<D>, blocks_for(n), kThreads, 0, as_stream(stream), dev(p), dev(g), dev(buf),
            n, s);
}

template <class T>
void adam_step(T* p, const T* g, T* m, T* v, int64_t n, const AdamParams& params, int64_t step,
               void* stream) {
  RG_CHECK(n >= 0, "cuda::adam_step: element count must be >= 0, got ", n);
  RG_CHECK(step >= 1, "cuda::adam_step: step numbers start at 1, got ", step);
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
  RG_LAUNCH(adam_kernel<D>, blocks_for(n), kThreads, 0, as_stream(stream), dev(p), dev(g), dev(m),
            dev(v), n, a);
}

#define RG_INSTANTIATE(T)                                                              \
  template void sgd_step<T>(T*, const T*, T*, int64_t, const SgdParams&, bool, void*); \
  template void adam_step<T>(T*, const T*, T*, T*, int64_t, const AdamParams&, int64_t, void*);
RG_INSTANTIATE(float)
RG_INSTANTIATE(double)
RG_INSTANTIATE(Half)
RG_INSTANTIATE(BFloat16)
#undef RG_INSTANTIATE

}  // namespace rg::kernels::cuda
