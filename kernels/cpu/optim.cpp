// Single-pass optimizer loops: each element is read and written once per step.
#include "kernels/cpu/optim.h"

#include <cmath>

#include "kernels/cpu/parallel.h"

namespace rg::kernels::cpu {

template <class T>
void sgd_step(T* p, const T* g, T* buf, int64_t n, const SgdParams& s, bool first_step) {
  const T lr = T(s.lr), mom = T(s.momentum), damp = T(1.0 - s.dampening), wd = T(s.weight_decay);
  parallel_for(0, n, 1 << 15, [&](int64_t lo, int64_t hi) {
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
  });
}

template <class T>
void adam_step(T* p, const T* g, T* m, T* v, int64_t n, const AdamParams& a, int64_t step) {
  const double bc1 = 1.0 - std::pow(a.beta1, double(step));
  const double bc2 = 1.0 - std::pow(a.beta2, double(step));
  const T step_size = T(a.lr / bc1);
  const T inv_sqrt_bc2 = T(1.0 / std::sqrt(bc2));
  const T b1 = T(a.beta1), b2 = T(a.beta2), eps = T(a.eps), wd = T(a.weight_decay);
  const T decay = T(1.0 - a.lr * a.weight_decay);
  parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
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
  });
}

template void sgd_step<float>(float*, const float*, float*, int64_t, const SgdParams&, bool);
template void sgd_step<double>(double*, const double*, double*, int64_t, const SgdParams&, bool);
template void adam_step<float>(float*, const float*, float*, float*, int64_t, const AdamParams&,
                               int64_t);
template void adam_step<double>(double*, const double*, double*, double*, int64_t,
                                const AdamParams&, int64_t);

}  // namespace rg::kernels::cpu
