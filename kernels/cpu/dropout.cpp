// Dropout<Cpu> (kernels/dropout.h): one Philox block per group of four elements, in parallel over
// groups, so the mask does not depend on the thread count.
#include "kernels/dropout.h"

#include <tuple>

#include "kernels/cpu/parallel.h"
#include "kernels/philox.h"

namespace rg::kernels {
namespace {

constexpr int64_t kGroupGrain = 4096;

// mask (and, with x, out = x * mask) over [0, n).
template <class T>
void draw(const T* x, T* out, T* mask, int64_t n, double p, T scale, uint64_t seed,
          uint64_t offset, Ctx ctx) {
  const int64_t groups = (n + 3) / 4;
  cpu::parallel_for(
      0, groups, kGroupGrain,
      [&](int64_t lo, int64_t hi) {
        for (int64_t g = lo; g < hi; ++g) {
          const philox::U32x4 r = philox::block(seed, offset + uint64_t(g));
          for (int64_t j = 0; j < 4 && 4 * g + j < n; ++j) {
            const int64_t i = 4 * g + j;
            mask[i] = double(philox::to_uniform(r.v[j])) >= p ? scale : T(0);
            if (x) out[i] = x[i] * mask[i];
          }
        }
      },
      ctx.threads);
}

}  // namespace

template <>
template <class T>
void Dropout<Cpu>::mask(T* mask, int64_t n, double p, T scale, uint64_t seed, uint64_t offset,
                        Ctx ctx) {
  detail::check_dropout("dropout_mask", n, p);
  draw<T>(nullptr, nullptr, mask, n, p, scale, seed, offset, ctx);
}

template <>
template <class T>
void Dropout<Cpu>::forward(const T* x, T* out, T* mask, int64_t n, double p, T scale,
                           uint64_t seed, uint64_t offset, Ctx ctx) {
  detail::check_dropout("dropout_forward", n, p);
  draw<T>(x, out, mask, n, p, scale, seed, offset, ctx);
}

template <>
template <class T>
void Dropout<Cpu>::backward(const T* grad, const T* mask, T* grad_in, int64_t n, Ctx ctx) {
  detail::check_dropout("dropout_backward", n, 0.0);
  cpu::parallel_for(
      0, n, kGroupGrain * 4,
      [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) grad_in[i] = grad[i] * mask[i];
      },
      ctx.threads);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_dropout_kernels() {
  using K = Dropout<Cpu>;
  return std::tuple{&K::mask<T>, &K::forward<T>, &K::backward<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_dropout_kernels)

}  // namespace rg::kernels
