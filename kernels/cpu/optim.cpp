// Optim<Cpu> (kernels/optim.h): single-pass loops, each element read and written once per step.
#include "kernels/optim.h"

#include <cmath>
#include <tuple>

#include "kernels/cpu/parallel.h"

namespace rg::kernels {

template <>
template <class T>
void Optim<Cpu>::sgd_step(T* p, const T* g, T* buf, int64_t n, const SgdParams& s, bool first_step,
                          Ctx ctx) {
  detail::check_sgd(n, s, buf);
  const T lr = T(s.lr), mom = T(s.momentum), damp = T(1.0 - s.dampening), wd = T(s.weight_decay);
  cpu::parallel_for(
      0, n, 1 << 15,
      [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          T d = g[i];
          if (s.weight_decay != 0) d += wd * p[i];
          if (s.momentum != 0) {
            const T b = first_step ? d : mom * buf[i] + damp * d;
            buf[i] = b;
            d = s.nesterov ? d + mom * b : b;
          }
          p[i] -= lr * d;
        }
      },
      ctx.threads);
}

template <>
template <class T>
void Optim<Cpu>::adam_step(T* p, const T* g, T* m, T* v, int64_t n, const AdamParams& a,
                           int64_t step, Ctx ctx) {
  detail::check_adam(n, step);
  const double bc1 = 1.0 - std::pow(a.beta1, double(step));
  const double bc2 = 1.0 - std::pow(a.beta2, double(step));
  const T step_size = T(a.lr / bc1);
  const T inv_sqrt_bc2 = T(1.0 / std::sqrt(bc2));
  const T b1 = T(a.beta1), b2 = T(a.beta2), eps = T(a.eps), wd = T(a.weight_decay);
  const T decay = T(1.0 - a.lr * a.weight_decay);
  cpu::parallel_for(
      0, n, 1 << 14,
      [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          T grad = g[i];
          if (a.weight_decay != 0) {
            if (a.decoupled_weight_decay) {
              p[i] *= decay;
            } else {
              grad += wd * p[i];
            }
          }
          m[i] = b1 * m[i] + (T(1) - b1) * grad;
          v[i] = b2 * v[i] + (T(1) - b2) * grad * grad;
          const T denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
          p[i] -= step_size * m[i] / denom;
        }
      },
      ctx.threads);
}

template <>
template <class T>
void Optim<Cpu>::sgd_step_many(const ParamUpdate<T>* updates, int64_t count,
                               const SgdParams& params, Ctx ctx) {
  SgdParams s = params;
  for (int64_t i = 0; i < count; ++i) {
    const ParamUpdate<T>& u = updates[i];
    RG_CHECK(u.replay_values == nullptr,
             "sgd_step_many: replay values (a CUDA graph's) on the CPU");
    if (u.skip_if != nullptr && *u.skip_if != 0.0f) continue;
    s.weight_decay = u.weight_decay;
    sgd_step(u.p, u.g, u.state1, u.n, s, u.first_step, ctx);
  }
}

template <>
template <class T>
void Optim<Cpu>::adam_step_many(const ParamUpdate<T>* updates, int64_t count,
                                const AdamParams& params, Ctx ctx) {
  AdamParams a = params;
  for (int64_t i = 0; i < count; ++i) {
    const ParamUpdate<T>& u = updates[i];
    RG_CHECK(u.replay_values == nullptr,
             "adam_step_many: replay values (a CUDA graph's) on the CPU");
    RG_CHECK(u.skip_if == nullptr && u.device_values == nullptr,
             "adam_step_many: a skip flag or step counts in device memory on the CPU");
    a.weight_decay = u.weight_decay;
    adam_step(u.p, u.g, u.state1, u.state2, u.n, a, u.step, ctx);
  }
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_optim_kernels() {
  using K = Optim<Cpu>;
  return std::tuple{&K::sgd_step<T>, &K::adam_step<T>, &K::sgd_step_many<T>, &K::adam_step_many<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_optim_kernels)

}  // namespace rg::kernels
