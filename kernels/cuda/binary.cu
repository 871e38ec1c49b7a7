// Binary<Cuda> (kernels/binary.h): one grid-stride kernel per operation and broadcast form (the
// op is a template argument, so the inner loop has no switch), then the launchers that pick it at
// run time.
#include <tuple>
#include <type_traits>

#include "kernels/binary.h"
#include "kernels/cuda/check.h"
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
    const auto [ia, ib] = unravel(i, g.ndim, g.shape, g.a_strides, g.b_strides);
    out[i] = store<D>(apply_binary<Op>(load(a[ia]), load(b[ib])));
  }
}

template <class D>
__global__ void axpy_kernel(compute_t<D> alpha, const D* x, D* out, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    out[i] = store<D>(load(out[i]) + alpha * load(x[i]));
  }
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
  RG_ASSERT(false, "unknown BinaryOp ", static_cast<int>(op));
}

template <class F>
void with_bool(bool b, F&& f) {
  if (b) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

}  // namespace
}  // namespace rg::kernels::cuda

namespace rg::kernels {

template <>
template <class T>
void Binary<Cuda>::binary(BinaryOp op, const T* a, const T* b, T* out, int64_t n, Ctx ctx) {
  using namespace cuda::detail;
  kernels::detail::check_elementwise_size("binary", n);
  void* stream = ctx.stream;
  if (n == 0) return;
  using D = device_t<T>;
  cuda::with_binary_op(op, [&](auto k) {
    RG_LAUNCH((cuda::binary_kernel<decltype(k)::value, D>), blocks_for(n), kThreads, 0,
              as_stream(stream), dev(a), dev(b), dev(out), n);
  });
}

template <>
template <class T>
void Binary<Cuda>::binary_scalar(BinaryOp op, const T* a, double s, T* out, int64_t n,
                                 bool scalar_first, Ctx ctx) {
  using namespace cuda::detail;
  kernels::detail::check_elementwise_size("binary_scalar", n);
  void* stream = ctx.stream;
  if (n == 0) return;
  using D = device_t<T>;
  const auto sa = static_cast<compute_t<D>>(s);
  cuda::with_binary_op(op, [&](auto k) {
    cuda::with_bool(scalar_first, [&](auto first) {
      RG_LAUNCH((cuda::binary_scalar_kernel<decltype(k)::value, decltype(first)::value, D>),
                blocks_for(n), kThreads, 0, as_stream(stream), dev(a), sa, dev(out), n);
    });
  });
}

template <>
template <class T>
void Binary<Cuda>::binary_per_channel(BinaryOp op, const T* a, const T* b, T* out, int64_t outer,
                                      int64_t channels, int64_t inner, bool b_first, Ctx ctx) {
  using namespace cuda::detail;
  void* stream = ctx.stream;
  kernels::detail::check_per_channel(outer, channels, inner);
  const int64_t n = outer * channels * inner;
  if (n == 0) return;
  using D = device_t<T>;
  cuda::with_binary_op(op, [&](auto k) {
    cuda::with_bool(b_first, [&](auto first) {
      if (inner == 1) {  // the bias form: one division fewer per element
        RG_LAUNCH((cuda::binary_bias_kernel<decltype(k)::value, decltype(first)::value, D>),
                  blocks_for(n), kThreads, 0, as_stream(stream), dev(a), dev(b), dev(out), n,
                  channels);
      } else {
        RG_LAUNCH((cuda::binary_per_channel_kernel<decltype(k)::value, decltype(first)::value, D>),
                  blocks_for(n), kThreads, 0, as_stream(stream), dev(a), dev(b), dev(out), n,
                  channels, inner);
      }
    });
  });
}

template <>
template <class T>
void Binary<Cuda>::binary_broadcast(BinaryOp op, const T* a, const int64_t* a_strides, const T* b,
                                    const int64_t* b_strides, T* out, const int64_t* out_shape,
                                    int ndim, Ctx ctx) {
  using namespace cuda::detail;
  void* stream = ctx.stream;
  kernels::detail::check_broadcast("binary_broadcast", ndim, out_shape);
  cuda::BroadcastGeometry g{};
  g.ndim = ndim;
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    g.shape[d] = out_shape[d];
    g.a_strides[d] = a_strides[d];
    g.b_strides[d] = b_strides[d];
    n *= out_shape[d];
  }
  if (n == 0) return;
  using D = device_t<T>;
  cuda::with_binary_op(op, [&](auto k) {
    RG_LAUNCH((cuda::binary_broadcast_kernel<decltype(k)::value, D>), blocks_for(n), kThreads, 0,
              as_stream(stream), dev(a), dev(b), dev(out), n, g);
  });
}

template <>
template <class T>
void Binary<Cuda>::axpy(double alpha, const T* x, T* out, int64_t n, Ctx ctx) {
  using namespace cuda::detail;
  kernels::detail::check_elementwise_size("axpy", n);
  void* stream = ctx.stream;
  if (n == 0) return;
  using D = device_t<T>;
  RG_LAUNCH((cuda::axpy_kernel<D>), blocks_for(n), kThreads, 0, as_stream(stream),
            static_cast<compute_t<D>>(alpha), dev(x), dev(out), n);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_binary_kernels() {
  using K = Binary<Cuda>;
  return std::tuple{&K::binary<T>, &K::binary_scalar<T>, &K::binary_per_channel<T>,
                    &K::binary_broadcast<T>, &K::axpy<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_binary_kernels)

}  // namespace rg::kernels
