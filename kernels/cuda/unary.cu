// Unary<Cuda> (kernels/unary.h): one grid-stride kernel per operation (the op is a template
// argument, so the inner loop has no switch), then the launchers that pick it at run time.
#include <tuple>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"
#include "kernels/unary.h"

namespace rg::kernels::cuda {
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

template <UnaryOp Op, class D>
__global__ void unary_kernel(const D* x, D* out, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    out[i] = store<D>(apply_unary<Op>(load(x[i])));
  }
}

// Unary<Cpu>'s special cases: p == 2 squares, p == 1 copies, anything else is pow.
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
  RG_ASSERT(false, "unknown UnaryOp ", static_cast<int>(op));
}

}  // namespace
}  // namespace rg::kernels::cuda

namespace rg::kernels {

template <>
template <class T>
void Unary<Cuda>::unary(UnaryOp op, const T* x, T* out, int64_t n, Ctx ctx) {
  using namespace cuda::detail;
  kernels::detail::check_elementwise_size("unary", n);
  void* stream = ctx.stream;
  if (n == 0) return;
  using D = device_t<T>;
  cuda::with_unary_op(op, [&](auto k) {
    RG_LAUNCH((cuda::unary_kernel<decltype(k)::value, D>), blocks_for(n), kThreads, 0,
              as_stream(stream), dev(x), dev(out), n);
  });
}

template <>
template <class T>
void Unary<Cuda>::pow_scalar(const T* x, double p, T* out, int64_t n, Ctx ctx) {
  using namespace cuda::detail;
  kernels::detail::check_elementwise_size("pow_scalar", n);
  void* stream = ctx.stream;
  if (n == 0) return;
  using D = device_t<T>;
  using A = compute_t<D>;
  const A pa = static_cast<A>(p);
  const unsigned int grid = blocks_for(n);
  if (pa == A(2)) {
    RG_LAUNCH((cuda::pow_scalar_kernel<cuda::PowKind::square, D>), grid, kThreads, 0,
              as_stream(stream), dev(x), pa, dev(out), n);
  } else if (pa == A(1)) {
    RG_LAUNCH((cuda::pow_scalar_kernel<cuda::PowKind::identity, D>), grid, kThreads, 0,
              as_stream(stream), dev(x), pa, dev(out), n);
  } else {
    RG_LAUNCH((cuda::pow_scalar_kernel<cuda::PowKind::general, D>), grid, kThreads, 0,
              as_stream(stream), dev(x), pa, dev(out), n);
  }
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_unary_kernels() {
  using K = Unary<Cuda>;
  return std::tuple{&K::unary<T>, &K::pow_scalar<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_unary_kernels)

}  // namespace rg::kernels
