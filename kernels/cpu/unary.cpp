// Unary math with Eigen array maps, parallel over chunks.
#include "kernels/cpu/unary.h"


#include "kernels/cpu/eigen_maps.h"
#include "kernels/cpu/parallel.h"

namespace rg::kernels::cpu {
namespace {
constexpr int64_t kGrain = 1 << 14;
}  // namespace

template <class T>
void unary(UnaryOp op, const T* x, T* out, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    ConstArrayMap<T> a(x + lo, hi - lo);
    ArrayMap<T> o(out + lo, hi - lo);
    switch (op) {
      case UnaryOp::neg: o = -a; break;
      case UnaryOp::exp: o = a.exp(); break;
      case UnaryOp::log: o = a.log(); break;
      case UnaryOp::sqrt: o = a.sqrt(); break;
    }
  });
}

template <class T>
void pow_scalar(const T* x, T p, T* out, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    ConstArrayMap<T> a(x + lo, hi - lo);
    ArrayMap<T> o(out + lo, hi - lo);
    if (p == T(2)) {
      o = a.square();
    } else if (p == T(1)) {
      o = a;
    } else {
      o = a.pow(p);
    }
  });
}

template void unary<float>(UnaryOp, const float*, float*, int64_t);
template void unary<double>(UnaryOp, const double*, double*, int64_t);
template void pow_scalar<float>(const float*, float, float*, int64_t);
template void pow_scalar<double>(const double*, double, double*, int64_t);

}  // namespace rg::kernels::cpu
