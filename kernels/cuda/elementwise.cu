// Elementwise unary and binary kernels: one grid-stride kernel per operation (the op is a template
// argument, so the inner loop has no switch), then the launchers that pick it at run time.
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"

namespace rg::kernels::cuda {

// binary_broadcast's shape and strides, passed to the kernel by value. Outside the anonymous
// namespace: a lambda of the (external) launcher captures it.
struct BroadcastGeometry {
  int ndim;
  int64_t shape[kMaxBroadcastDims];
  int64_t a_strides[kMaxBroadcastDims];
  int64_t b_strides[kMaxBroadcastDims];
};

namespace {

using namespace detail;

template <UnaryOp Op, class A>
__device__ __forceinline__ A apply_unary(A x) {
  if constexpr (Op == UnaryOp::neg) {
    return -x;
  } else if constexpr (Op == UnaryOp::exp) {
    return exp_(x);
  } else if constexpr (Op == UnaryOp::log) {
    return log_(x);
  } else {
    static_assert(Op == UnaryOp::sqrt);
    return sqrt_(x);
  }
}

template <BinaryOp Op, class A>
__device__ __forceinline__ A apply_binary(A x, A y) {
  if constexpr (Op == BinaryOp::add) {
    return x + y;
  } else if constexpr (Op == BinaryOp::sub) {
    return x - y;
  } else if constexpr (Op == BinaryOp::mul) {
    return x * y;
  } else {
    static_assert(Op == BinaryOp::div);
    return x / y;
  }
}

template <UnaryOp Op, class D>
__global__ void unary_kernel(const D* x, D* out, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    out[i] = store<D>(apply_unary<Op>(load(x[i])));
  }
}

// kernels/cpu/unary.cpp's special cases: p == 2 squares, p == 1 copies, anything else is pow.
enum class PowKind { square, identity, general };

template <PowKind Kind, class D>
__global__ void pow_scalar_kernel(const D* x, compute_t<D> p, D* out, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    if constexpr (Kind == PowKind::square) {
      const compute_t<D> v = load(x[i]);
      out[i] = store<D>(v * v);
    } else if constexpr (Kind == PowKind::identity) {
      out[i] = x[i];
    } else {
      out[i] = store<D>(pow_(load(x[i]), p));
    }
  }
}

template <BinaryOp Op, class D>
__global__ void binary_kernel(const D* a, const D* b, D* out, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    out[i] = store<D>(apply_binary<Op>(load(a[i]), load(b[i])));
  }
}

template <BinaryOp Op, bool kScalarFirst, class D>
__global__ void binary_scalar_kernel(const D* a, compute_t<D> s, D* out, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const compute_t<D> x = load(a[i]);
    out[i] = store<D>(kScalarFirst ? apply_binary<Op>(s, x) : apply_binary<Op>(x, s));
  }
}

// Element i of a contiguous [outer, channels, inner] array is in channel (i / inner) % channels.
template <BinaryOp Op, bool kBFirst, class D>
__global__ void binary_per_channel_kernel(const D* a, const D* b, D* out, int64_t n,
                                          int64_t channels, int64_t inner) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const compute_t<D> x = load(a[i]);
    const compute_t<D> y = load(b[(i / inner) % channels]);
    out[i] = store<D>(kBFirst ? apply_binary<Op>(y, x) : apply_binary<Op>(x, y));
  }
}

// inner == 1: one division fewer per element.
template <BinaryOp Op, bool kBFirst, class D>
__global__ void binary_bias_kernel(const D* a, const D* b, D* out, int64_t n, int64_t cols) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const compute_t<D> x = load(a[i]);
    const compute_t<D> y = load(b[i % cols]);
    out[i] = store<D>(kBFirst ? apply_binary<Op>(y, x) : apply_binary<Op>(x, y));
  }
}

// General broadcasting: element i of `out` is unravelled over `shape`, and a and b are read
// through their strides (0 along broadcast dimensions).
template <BinaryOp Op, class D>
__global__ void binary_broadcast_kernel(const D* a, const D* b, D* out, int64_t n,
                                        BroadcastGeometry g) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    int64_t rest = i, ia = 0, ib = 0;
    for (int d = g.ndim - 1; d >= 0; --d) {
      const int64_t idx = rest % g.shape[d];
      rest /= g.shape[d];
      ia += idx * g.a_strides[d];
      ib += idx * g.b_strides[d];
    }
    out[i] = store<D>(apply_binary<Op>(load(a[ia]), load(b[ib])));
  }
}

template <class D>
__global__ void axpy_kernel(compute_t<D> alpha, const D* x, D* out, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    out[i] = store<D>(load(out[i]) + alpha * load(x[i]));
  }
}

// Calls f(std::integral_constant<Op, op>{}) so that a run-time op selects a kernel template.
template <class F>
void with_unary_op(UnaryOp op, F&& f) {
  switch (op) {
    case UnaryOp::neg:
      return f(std::integral_constant<UnaryOp, UnaryOp::neg>{});
    case UnaryOp::exp:
      return f(std::integral_constant<UnaryOp, UnaryOp::exp>{});
    case UnaryOp::log:
      return f(std::integral_constant<UnaryOp, UnaryOp::log>{});
    case UnaryOp::sqrt:
      return f(std::integral_constant<UnaryOp, UnaryOp::sqrt>{});
  }
  RG_FAIL("cuda::unary: unknown UnaryOp ", static_cast<int>(op));
}

template <class F>
void with_binary_op(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::add:
      return f(std::integral_constant<BinaryOp, BinaryOp::add>{});
    case BinaryOp::sub:
      return f(std::integral_constant<BinaryOp, BinaryOp::sub>{});
    case BinaryOp::mul:
      return f(std::integral_constant<BinaryOp, BinaryOp::mul>{});
    case BinaryOp::div:
      return f(std::integral_constant<BinaryOp, BinaryOp::div>{});
  }
  RG_FAIL("cuda::binary: unknown BinaryOp ", static_cast<int>(op));
}

template <class F>
void with_bool(bool b, F&& f) {
  if (b) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

void check_size(const char* what, int64_t n) {
  RG_CHECK(n >= 0, "cuda::", what, ": element count must be >= 0, got ", n);
}

}  // namespace

template <class T>
void unary(UnaryOp op, const T* x, T* out, int64_t n, void* stream) {
  check_size("unary", n);
  if (n == 0) return;
  using D = device_t<T>;
  with_unary_op(op, [&](auto k) {
    RG_LAUNCH((unary_kernel<decltype(k)::value, D>), blocks_for(n), kThreads, 0, as_stream(stream),
              dev(x), dev(out), n);
  });
}

template <class T>
void pow_scalar(const T* x, double p, T* out, int64_t n, void* stream) {
  check_size("pow_scalar", n);
  if (n == 0) return;
  using D = device_t<T>;
  using A = compute_t<D>;
  const A pa = static_cast<A>(p);
  const unsigned int grid = blocks_for(n);
  if (pa == A(2)) {
    RG_LAUNCH((pow_scalar_kernel<PowKind::square, D>), grid, kThreads, 0, as_stream(stream), dev(x),
              pa, dev(out), n);
  } else if (pa == A(1)) {
    RG_LAUNCH((pow_scalar_kernel<PowKind::identity, D>), grid, kThreads, 0, as_stream(stream),
              dev(x), pa, dev(out), n);
  } else {
    RG_LAUNCH((pow_scalar_kernel<PowKind::general, D>), grid, kThreads, 0, as_stream(stream),
              dev(x), pa, dev(out), n);
  }
}

template <class T>
void binary(BinaryOp op, const T* a, const T* b, T* out, int64_t n, void* stream) {
  check_size("binary", n);
  if (n == 0) return;
  using D = device_t<T>;
  with_binary_op(op, [&](auto k) {
    RG_LAUNCH((binary_kernel<decltype(k)::value, D>), blocks_for(n), kThreads, 0, as_stream(stream),
              dev(a), dev(b), dev(out), n);
  });
}

template <class T>
void binary_scalar(BinaryOp op, const T* a, double s, T* out, int64_t n, bool scalar_first,
                   void* stream) {
  check_size("binary_scalar", n);
  if (n == 0) return;
  using D = device_t<T>;
  const auto sa = static_cast<compute_t<D>>(s);
  with_binary_op(op, [&](auto k) {
    with_bool(scalar_first, [&](auto first) {
      RG_LAUNCH((binary_scalar_kernel<decltype(k)::value, decltype(first)::value, D>),
                blocks_for(n), kThreads, 0, as_stream(stream), dev(a), sa, dev(out), n);
    });
  });
}

template <class T>
void binary_per_channel(BinaryOp op, const T* a, const T* b, T* out, int64_t outer,
                        int64_t channels, int64_t inner, bool b_first, void* stream) {
  RG_CHECK(outer >= 0 && channels >= 0 && inner >= 0,
           "cuda::binary_per_channel: sizes must be >= 0, got outer ", outer, ", channels ",
           channels, ", inner ", inner);
  const int64_t n = outer * channels * inner;
  if (n == 0) return;
  using D = device_t<T>;
  with_binary_op(op, [&](auto k) {
    with_bool(b_first, [&](auto first) {
      RG_LAUNCH((binary_per_channel_kernel<decltype(k)::value, decltype(first)::value, D>),
                blocks_for(n), kThreads, 0, as_stream(stream), dev(a), dev(b), dev(out), n,
                channels, inner);
    });
  });
}

template <class T>
void binary_bias(BinaryOp op, const T* a, const T* b, T* out, int64_t rows, int64_t cols,
                 bool b_first, void* stream) {
  RG_CHECK(rows >= 0 && cols >= 0, "cuda::binary_bias: sizes must be >= 0, got rows ", rows,
           ", cols ", cols);
  const int64_t n = rows * cols;
  if (n == 0) return;
  using D = device_t<T>;
  with_binary_op(op, [&](auto k) {
    with_bool(b_first, [&](auto first) {
      RG_LAUNCH((binary_bias_kernel<decltype(k)::value, decltype(first)::value, D>), blocks_for(n),
                kThreads, 0, as_stream(stream), dev(a), dev(b), dev(out), n, cols);
    });
  });
}

template <class T>
void binary_broadcast(BinaryOp op, const T* a, const int64_t* a_strides, const T* b,
                      const int64_t* b_strides, T* out, const int64_t* out_shape, int ndim,
                      void* stream) {
  RG_CHECK(ndim >= 0 && ndim <= kMaxBroadcastDims, "cuda::binary_broadcast: ", ndim,
           " dimensions, at most ", kMaxBroadcastDims, " are supported");
  BroadcastGeometry g{};
  g.ndim = ndim;
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    RG_CHECK(out_shape[d] >= 0, "cuda::binary_broadcast: negative size ", out_shape[d]);
    g.shape[d] = out_shape[d];
    g.a_strides[d] = a_strides[d];
    g.b_strides[d] = b_strides[d];
    n *= out_shape[d];
  }
  if (n == 0) return;
  using D = device_t<T>;
  with_binary_op(op, [&](auto k) {
    RG_LAUNCH((binary_broadcast_kernel<decltype(k)::value, D>), blocks_for(n), kThreads, 0,
              as_stream(stream), dev(a), dev(b), dev(out), n, g);
  });
}

template <class T>
void axpy(double alpha, const T* x, T* out, int64_t n, void* stream) {
  check_size("axpy", n);
  if (n == 0) return;
  using D = device_t<T>;
  RG_LAUNCH((axpy_kernel<D>), blocks_for(n), kThreads, 0, as_stream(stream),
            static_cast<compute_t<D>>(alpha), dev(x), dev(out), n);
}

#define RG_INSTANTIATE(T)                                                                          \
  template void unary<T>(UnaryOp, const T*, T*, int64_t, void*);                                   \
  template void pow_scalar<T>(const T*, double, T*, int64_t, void*);                               \
  template void binary<T>(BinaryOp, const T*, const T*, T*, int64_t, void*);                       \
  template void binary_scalar<T>(BinaryOp, const T*, double, T*, int64_t, bool, void*);            \
  template void binary_per_channel<T>(BinaryOp, const T*, const T*, T*, int64_t, int64_t, int64_t, \
                                      bool, void*);                                                \
  template void binary_bias<T>(BinaryOp, const T*, const T*, T*, int64_t, int64_t, bool, void*);   \
  template void binary_broadcast<T>(BinaryOp, const T*, const int64_t*, const T*, const int64_t*,  \
                                    T*, const int64_t*, int, void*);                               \
  template void axpy<T>(double, const T*, T*, int64_t, void*);
RG_INSTANTIATE(float)
RG_INSTANTIATE(double)
RG_INSTANTIATE(Half)
RG_INSTANTIATE(BFloat16)
#undef RG_INSTANTIATE

}  // namespace rg::kernels::cuda
