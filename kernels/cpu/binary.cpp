// Binary arithmetic with Eigen array maps for the contiguous cases and an odometer loop for
// broadcasting (innermost dimension kept as a tight loop).
#include "kernels/cpu/binary.h"

#include <vector>

#include "kernels/cpu/eigen_maps.h"
#include "kernels/cpu/parallel.h"

namespace rg::kernels::cpu {
namespace {


constexpr int64_t kGrain = 1 << 15;

template <class T>
inline T apply(BinaryOp op, T x, T y) {
  switch (op) {
    case BinaryOp::add: return x + y;
    case BinaryOp::sub: return x - y;
    case BinaryOp::mul: return x * y;
    case BinaryOp::div: return x / y;
  }
  return T(0);
}

}  // namespace

template <class T>
void binary(BinaryOp op, const T* a, const T* b, T* out, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    ConstArrayMap<T> x(a + lo, hi - lo), y(b + lo, hi - lo);
    ArrayMap<T> o(out + lo, hi - lo);
    switch (op) {
      case BinaryOp::add: o = x + y; break;
      case BinaryOp::sub: o = x - y; break;
      case BinaryOp::mul: o = x * y; break;
      case BinaryOp::div: o = x / y; break;
    }
  });
}

template <class T>
void binary_scalar(BinaryOp op, const T* a, T s, T* out, int64_t n, bool scalar_first) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    ConstArrayMap<T> x(a + lo, hi - lo);
    ArrayMap<T> o(out + lo, hi - lo);
    switch (op) {
      case BinaryOp::add: o = x + s; break;
      case BinaryOp::sub:
        if (scalar_first) o = s - x; else o = x - s;
        break;
      case BinaryOp::mul: o = x * s; break;
      case BinaryOp::div:
        if (scalar_first) o = s / x; else o = x / s;
        break;
    }
  });
}

template <class T>
void binary_broadcast(BinaryOp op, const T* a, const int64_t* a_strides, const T* b,
                      const int64_t* b_strides, T* out, const int64_t* out_shape, int ndim) {
  if (ndim == 0) {
    out[0] = apply(op, a[0], b[0]);
    return;
  }
  const int64_t inner = out_shape[ndim - 1];
  const int64_t as = a_strides[ndim - 1], bs = b_strides[ndim - 1];
  int64_t rows = 1;
  for (int d = 0; d < ndim - 1; ++d) rows *= out_shape[d];
  if (inner == 0 || rows == 0) return;
  parallel_for(0, rows, std::max<int64_t>(1, kGrain / inner), [&](int64_t lo, int64_t hi) {
    std::vector<int64_t> idx(size_t(ndim), 0);
    // Decompose the first row index into an odometer position.
    int64_t r = lo;
    for (int d = ndim - 2; d >= 0; --d) {
      idx[size_t(d)] = r % out_shape[d];
      r /= out_shape[d];
    }
    for (int64_t row = lo; row < hi; ++row) {
      int64_t ao = 0, bo = 0;
      for (int d = 0; d < ndim - 1; ++d) {
        ao += idx[size_t(d)] * a_strides[d];
        bo += idx[size_t(d)] * b_strides[d];
      }
      T* o = out + row * inner;
      const T* pa = a + ao;
      const T* pb = b + bo;
      if (as == 1 && bs == 1) {
        for (int64_t i = 0; i < inner; ++i) o[i] = apply(op, pa[i], pb[i]);
      } else if (as == 1) {
        const T y = pb[0];
        for (int64_t i = 0; i < inner; ++i) o[i] = apply(op, pa[i], y);
      } else if (bs == 1) {
        const T x = pa[0];
        for (int64_t i = 0; i < inner; ++i) o[i] = apply(op, x, pb[i]);
      } else {
        for (int64_t i = 0; i < inner; ++i) o[i] = apply(op, pa[i * as], pb[i * bs]);
      }
      for (int d = ndim - 2; d >= 0; --d) {
        if (++idx[size_t(d)] < out_shape[d]) break;
        idx[size_t(d)] = 0;
      }
    }
  });
}

template <class T>
void axpy(T alpha, const T* x, T* out, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    ArrayMap<T>(out + lo, hi - lo) += alpha * ConstArrayMap<T>(x + lo, hi - lo);
  });
}

#define RG_INSTANTIATE(T)                                                                      \
  template void binary<T>(BinaryOp, const T*, const T*, T*, int64_t);                          \
  template void binary_scalar<T>(BinaryOp, const T*, T, T*, int64_t, bool);                    \
  template void binary_broadcast<T>(BinaryOp, const T*, const int64_t*, const T*,              \
                                    const int64_t*, T*, const int64_t*, int);                  \
  template void axpy<T>(T, const T*, T*, int64_t);
RG_INSTANTIATE(float)
RG_INSTANTIATE(double)
#undef RG_INSTANTIATE

}  // namespace rg::kernels::cpu
