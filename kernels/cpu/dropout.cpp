// Dropout<Cpu> (kernels/dropout.h): one Philox block per group of four elements, in parallel over
// groups, so the mask does not depend on the thread count.
#include "kernels/dropout.h"

#include <algorithm>
#include <tuple>

#include "kernels/cpu/parallel.h"
#include "kernels/philox.h"

namespace rg::kernels {
namespace {

constexpr int64_t kGroupGrain = 4096;

// Groups per tile of draw(): the Philox words of 64 groups (256 elements) are drawn first, then
// mask and output are written by plain loops that vectorize.
constexpr int64_t kTileGroups = 64;

// mask (and, with x, out = x * mask) over [0, n).
template <class T>
void draw(const T* x, T* out, T* mask, int64_t n, double p, T scale, uint64_t seed, uint64_t offset,
          Ctx ctx) {
  const int64_t groups = (n + 3) / 4;
  const uint32_t threshold = detail::dropout_keep_threshold(p);  // an integer compare vectorizes
  cpu::parallel_for(
      0, groups, kGroupGrain,
      [&](int64_t lo, int64_t hi) {
        uint32_t words[4 * kTileGroups];
        for (int64_t g0 = lo; g0 < hi; g0 += kTileGroups) {
          const int64_t g1 = std::min(hi, g0 + kTileGroups);
          for (int64_t g = g0; g < g1; ++g) {
            const philox::U32x4 r = philox::block(seed, offset + uint64_t(g));
            for (int j = 0; j < 4; ++j) words[4 * (g - g0) + j] = r.v[j];
          }
          const int64_t i0 = 4 * g0, len = std::min(n, 4 * g1) - i0;
          T* m = mask + i0;
          for (int64_t k = 0; k < len; ++k) m[k] = (words[k] >> 8) >= threshold ? scale : T(0);
          if (x) {
            const T* xi = x + i0;
            T* o = out + i0;
            for (int64_t k = 0; k < len; ++k) o[k] = xi[k] * m[k];
          }
        }
      },
      ctx.threads);
}

}  // namespace

template <>
template <class T>
void Dropout<Cpu>::mask(T* mask, int64_t n, double p, T scale, uint64_t seed,
                        philox::Offset offset, Ctx ctx) {
  detail::check_dropout("dropout_mask", n, p);
  draw<T>(nullptr, nullptr, mask, n, p, scale, seed, philox::host_offset(offset, "dropout_mask"),
          ctx);
}

template <>
template <class T>
void Dropout<Cpu>::forward(const T* x, T* out, T* mask, int64_t n, double p, T scale, uint64_t seed,
                           philox::Offset offset, Ctx ctx) {
  detail::check_dropout("dropout_forward", n, p);
  draw<T>(x, out, mask, n, p, scale, seed, philox::host_offset(offset, "dropout_forward"), ctx);
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
