// Unary<Cpu> (kernels/unary.h): Eigen array maps, parallel over chunks.
#include "kernels/unary.h"

#include <tuple>

#include "kernels/cpu/eigen_maps.h"
#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {
using cpu::ArrayMap;
using cpu::ConstArrayMap;
constexpr int64_t kGrain = 1 << 14;
}  // namespace

template <>
template <class T>
void Unary<Cpu>::unary(UnaryOp op, const T* x, T* out, int64_t n, Ctx ctx) {
  detail::check_elementwise_size("unary", n);
  cpu::parallel_for(
      0, n, kGrain,
      [&](int64_t lo, int64_t hi) {
        ConstArrayMap<T> a(x + lo, hi - lo);
        ArrayMap<T> o(out + lo, hi - lo);
        switch (op) {
          case UnaryOp::neg:
            o = -a;
            break;
          case UnaryOp::exp:
            o = a.exp();
            break;
          case UnaryOp::log:
            o = a.log();
            break;
          case UnaryOp::sqrt:
            o = a.sqrt();
            break;
        }
      },
      ctx.threads);
}

template <>
template <class T>
void Unary<Cpu>::pow_scalar(const T* x, double exponent, T* out, int64_t n, Ctx ctx) {
  detail::check_elementwise_size("pow_scalar", n);
  const T p = T(exponent);
  cpu::parallel_for(
      0, n, kGrain,
      [&](int64_t lo, int64_t hi) {
        ConstArrayMap<T> a(x + lo, hi - lo);
        ArrayMap<T> o(out + lo, hi - lo);
        if (p == T(2)) {
          o = a.square();
        } else if (p == T(1)) {
          o = a;
        } else {
          o = a.pow(p);
        }
      },
      ctx.threads);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_unary_kernels() {
  using K = Unary<Cpu>;
  return std::tuple{&K::unary<T>, &K::pow_scalar<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_unary_kernels)

}  // namespace rg::kernels
