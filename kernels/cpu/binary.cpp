// Binary<Cpu> (kernels/binary.h): Eigen array maps for the contiguous cases and an odometer loop
// for broadcasting (innermost dimension kept as a tight loop).
#include "kernels/binary.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "kernels/cpu/eigen_maps.h"
#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {
using cpu::ArrayMap;
using cpu::ConstArrayMap;
using cpu::parallel_for;

constexpr int64_t kGrain = 1 << 15;

template <class T>
inline T apply(BinaryOp op, T x, T y) {
  switch (op) {
    case BinaryOp::add:
      return x + y;
    case BinaryOp::sub:
      return x - y;
    case BinaryOp::mul:
      return x * y;
    case BinaryOp::div:
      return x / y;
  }
  return T(0);
}

// o = x op y with x and y arrays of o's length or scalars (Eigen-vectorized either way).
template <class X, class Y, class T>
void apply(BinaryOp op, const X& x, const Y& y, ArrayMap<T>& o) {
  switch (op) {
    case BinaryOp::add:
      o = x + y;
      break;
    case BinaryOp::sub:
      o = x - y;
      break;
    case BinaryOp::mul:
      o = x * y;
      break;
    case BinaryOp::div:
      o = x / y;
      break;
  }
}

// o = x op s, or s op x when scalar_first, over a contiguous array.
template <class T>
void apply_scalar(BinaryOp op, const ConstArrayMap<T>& x, T s, bool scalar_first,
                  ArrayMap<T>& o) {
  if (scalar_first) {
    apply(op, s, x, o);
  } else {
    apply(op, x, s, o);
  }
}

}  // namespace

template <>
template <class T>
void Binary<Cpu>::binary(BinaryOp op, const T* a, const T* b, T* out, int64_t n, Ctx ctx) {
  detail::check_elementwise_size("binary", n);
  parallel_for(
      0, n, kGrain,
      [&](int64_t lo, int64_t hi) {
        ConstArrayMap<T> x(a + lo, hi - lo), y(b + lo, hi - lo);
        ArrayMap<T> o(out + lo, hi - lo);
        apply(op, x, y, o);
      },
      ctx.threads);
}

template <>
template <class T>
void Binary<Cpu>::binary_scalar(BinaryOp op, const T* a, double scalar, T* out, int64_t n,
                                bool scalar_first, Ctx ctx) {
  detail::check_elementwise_size("binary_scalar", n);
  const T s = T(scalar);
  parallel_for(
      0, n, kGrain,
      [&](int64_t lo, int64_t hi) {
        ConstArrayMap<T> x(a + lo, hi - lo);
        ArrayMap<T> o(out + lo, hi - lo);
        apply_scalar(op, x, s, scalar_first, o);
      },
      ctx.threads);
}

template <>
template <class T>
void Binary<Cpu>::binary_per_channel(BinaryOp op, const T* a, const T* b, T* out, int64_t outer,
                                     int64_t channels, int64_t inner, bool b_first, Ctx ctx) {
  detail::check_per_channel(outer, channels, inner);
  const int64_t planes = outer * channels;
  if (planes == 0 || inner == 0) return;
  if (inner == 1) {  // b is a row repeated over outer (a [B, T, C] + [T, C] broadcast): row by row
    parallel_for(
        0, outer, std::max<int64_t>(1, kGrain / channels),
        [&](int64_t lo, int64_t hi) {
          const ConstArrayMap<T> y(b, channels);
          for (int64_t row = lo; row < hi; ++row) {
            const ConstArrayMap<T> x(a + row * channels, channels);
            ArrayMap<T> o(out + row * channels, channels);
            apply(op, b_first ? y : x, b_first ? x : y, o);
          }
        },
        ctx.threads);
    return;
  }
  parallel_for(
      0, planes, std::max<int64_t>(1, kGrain / inner),
      [&](int64_t lo, int64_t hi) {
        for (int64_t plane = lo; plane < hi; ++plane) {
          const T y = b[plane % channels];
          ConstArrayMap<T> x(a + plane * inner, inner);
          ArrayMap<T> o(out + plane * inner, inner);
          apply_scalar(op, x, y, b_first, o);  // per plane: vectorized over it
        }
      },
      ctx.threads);
}

template <>
template <class T>
void Binary<Cpu>::binary_broadcast(BinaryOp op, const T* a, const int64_t* a_strides, const T* b,
                                   const int64_t* b_strides, T* out, const int64_t* out_shape,
                                   int ndim, Ctx ctx) {
  detail::check_broadcast("binary_broadcast", ndim, out_shape);
  if (ndim == 0) {
    out[0] = apply(op, a[0], b[0]);
    return;
  }
  const int64_t inner = out_shape[ndim - 1];
  const int64_t as = a_strides[ndim - 1], bs = b_strides[ndim - 1];
  int64_t rows = 1;
  for (int d = 0; d < ndim - 1; ++d) rows *= out_shape[d];
  if (inner == 0 || rows == 0) return;
  parallel_for(
      0, rows, std::max<int64_t>(1, kGrain / inner),
      [&](int64_t lo, int64_t hi) {
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
      },
      ctx.threads);
}

template <>
template <class T>
void Binary<Cpu>::axpy(double alpha, const T* x, T* out, int64_t n, Ctx ctx) {
  detail::check_elementwise_size("axpy", n);
  const T a = T(alpha);
  parallel_for(
      0, n, kGrain,
      [&](int64_t lo, int64_t hi) {
        ArrayMap<T>(out + lo, hi - lo) += a * ConstArrayMap<T>(x + lo, hi - lo);
      },
      ctx.threads);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_binary_kernels() {
  using K = Binary<Cpu>;
  return std::tuple{&K::binary<T>, &K::binary_scalar<T>, &K::binary_per_channel<T>,
                    &K::binary_broadcast<T>, &K::axpy<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_binary_kernels)

}  // namespace rg::kernels
