// The activation kernels on the CPU (kernels/activation.h), with Eigen array maps, parallel over
// chunks; backward kernels fuse the derivative with the multiplication by the incoming gradient.
#include "kernels/activation.h"

#include <tuple>
#include <unsupported/Eigen/SpecialFunctions>

#include "kernels/cpu/eigen_maps.h"
#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {
using cpu::ArrayMap;
using cpu::ConstArrayMap;
using detail::kGeluInvSqrt2Pi;
using detail::kGeluKappa;
using detail::kGeluSqrt1_2;
using detail::kGeluSqrt2OverPi;
constexpr int64_t kGrain = 1 << 14;

// Runs fn(lo, hi) over parallel chunks of [0, n), with at most ctx.threads threads.
template <class F>
void for_chunks(int64_t n, Ctx ctx, F&& fn) {
  cpu::parallel_for(0, n, kGrain, fn, ctx.threads);
}

// Runs fn(x_chunk, out_chunk) over parallel chunks of two arrays.
template <class T, class F>
void map1(const T* x, T* out, int64_t n, Ctx ctx, F&& fn) {
  for_chunks(n, ctx, [&](int64_t lo, int64_t hi) {
    ArrayMap<T> o(out + lo, hi - lo);
    fn(ConstArrayMap<T>(x + lo, hi - lo), o);
  });
}

// Runs fn(grad_chunk, saved_chunk, grad_in_chunk) over parallel chunks of three arrays.
template <class T, class F>
void map2(const T* grad, const T* saved, T* grad_in, int64_t n, Ctx ctx, F&& fn) {
  for_chunks(n, ctx, [&](int64_t lo, int64_t hi) {
    ArrayMap<T> gi(grad_in + lo, hi - lo);
    fn(ConstArrayMap<T>(grad + lo, hi - lo), ConstArrayMap<T>(saved + lo, hi - lo), gi);
  });
}

// v * (x > 0 ? 1 : slope) over [lo, hi): a plain loop choosing between two constants, which
// vectorizes (a select between v and v * slope becomes a branch per element).
template <class T>
void times_slope(const T* v, const T* x, T* out, int64_t lo, int64_t hi, T slope) {
  for (int64_t i = lo; i < hi; ++i) out[i] = v[i] * (x[i] > T(0) ? T(1) : slope);
}

// out = x > 0 ? v : 0 over [lo, hi), as a loop the compiler turns into compare-and-mask vector
// code: both loads unconditional (the vectorizer checks for overlap at run time). Eigen 3.4's
// select() has no vectorized path, and a branch per element is mispredicted half the time on
// activations of either sign (it made relu_backward 15% of a ToyNet training step). A NaN in x
// gives 0 here.
template <class T>
void keep_where_positive(const T* v, const T* x, T* out, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) {
    const T vi = v[i];
    out[i] = x[i] > T(0) ? vi : T(0);
  }
}
// out = x < 0 ? 0 : x (relu that keeps NaN inputs as NaN, unlike max(x, 0)), likewise.
template <class T>
void zero_where_negative(const T* x, T* out, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) {
    const T xi = x[i];
    out[i] = xi < T(0) ? T(0) : xi;
  }
}
}  // namespace

template <>
template <class T>
void Activation<Cpu>::relu(const T* x, T* out, int64_t n, Ctx ctx) {
  if (!detail::check_activation_size("relu", n)) return;
  for_chunks(n, ctx, [&](int64_t lo, int64_t hi) { zero_where_negative(x, out, lo, hi); });
}

template <>
template <class T>
void Activation<Cpu>::relu_backward(const T* grad, const T* out, T* grad_in, int64_t n, Ctx ctx) {
  if (!detail::check_activation_size("relu_backward", n)) return;
  for_chunks(n, ctx,
             [&](int64_t lo, int64_t hi) { keep_where_positive(grad, out, grad_in, lo, hi); });
}

template <>
template <class T>
void Activation<Cpu>::leaky_relu(const T* x, T* out, int64_t n, double negative_slope, Ctx ctx) {
  if (!detail::check_activation_size("leaky_relu", n)) return;
  const T slope = T(negative_slope);
  for_chunks(n, ctx, [&](int64_t lo, int64_t hi) { times_slope(x, x, out, lo, hi, slope); });
}

template <>
template <class T>
void Activation<Cpu>::leaky_relu_backward(const T* grad, const T* x, T* grad_in, int64_t n,
                                          double negative_slope, Ctx ctx) {
  if (!detail::check_activation_size("leaky_relu_backward", n)) return;
  const T slope = T(negative_slope);
  for_chunks(n, ctx, [&](int64_t lo, int64_t hi) { times_slope(grad, x, grad_in, lo, hi, slope); });
}

template <>
template <class T>
void Activation<Cpu>::gelu(const T* x, T* out, int64_t n, bool approximate, Ctx ctx) {
  if (!detail::check_activation_size("gelu", n)) return;
  if (approximate) {
    map1(x, out, n, ctx, [](const auto& a, auto& o) {
      const auto inner = T(kGeluSqrt2OverPi) * (a + T(kGeluKappa) * a.cube());
      o = T(0.5) * a * (T(1) + inner.tanh());
    });
  } else {
    map1(x, out, n, ctx,
         [](const auto& a, auto& o) { o = T(0.5) * a * (T(1) + (a * T(kGeluSqrt1_2)).erf()); });
  }
}

template <>
template <class T>
void Activation<Cpu>::gelu_backward(const T* grad, const T* x, T* grad_in, int64_t n,
                                    bool approximate, Ctx ctx) {
  if (!detail::check_activation_size("gelu_backward", n)) return;
  if (approximate) {
    map2(grad, x, grad_in, n, ctx, [](const auto& g, const auto& a, auto& gi) {
      const Eigen::Array<T, Eigen::Dynamic, 1> t =
          (T(kGeluSqrt2OverPi) * (a + T(kGeluKappa) * a.cube())).tanh();
      const auto inner_derivative = T(kGeluSqrt2OverPi) * (T(1) + T(3 * kGeluKappa) * a.square());
      gi = g * (T(0.5) * (T(1) + t) + T(0.5) * a * (T(1) - t.square()) * inner_derivative);
    });
  } else {
    // d/dx [x Phi(x)] = Phi(x) + x phi(x)
    map2(grad, x, grad_in, n, ctx, [](const auto& g, const auto& a, auto& gi) {
      const auto cdf = T(0.5) * (T(1) + (a * T(kGeluSqrt1_2)).erf());
      const auto pdf = T(kGeluInvSqrt2Pi) * (T(-0.5) * a.square()).exp();
      gi = g * (cdf + a * pdf);
    });
  }
}

template <>
template <class T>
void Activation<Cpu>::sigmoid(const T* x, T* out, int64_t n, Ctx ctx) {
  if (!detail::check_activation_size("sigmoid", n)) return;
  // exp(-x) overflows to inf for very negative x, which correctly gives 0.
  map1(x, out, n, ctx, [](const auto& a, auto& o) { o = (T(1) + (-a).exp()).inverse(); });
}

template <>
template <class T>
void Activation<Cpu>::sigmoid_backward(const T* grad, const T* out, T* grad_in, int64_t n,
                                       Ctx ctx) {
  if (!detail::check_activation_size("sigmoid_backward", n)) return;
  map2(grad, out, grad_in, n, ctx,
       [](const auto& g, const auto& y, auto& gi) { gi = g * y * (T(1) - y); });
}

template <>
template <class T>
void Activation<Cpu>::tanh(const T* x, T* out, int64_t n, Ctx ctx) {
  if (!detail::check_activation_size("tanh", n)) return;
  map1(x, out, n, ctx, [](const auto& a, auto& o) { o = a.tanh(); });
}

template <>
template <class T>
void Activation<Cpu>::tanh_backward(const T* grad, const T* out, T* grad_in, int64_t n, Ctx ctx) {
  if (!detail::check_activation_size("tanh_backward", n)) return;
  map2(grad, out, grad_in, n, ctx,
       [](const auto& g, const auto& y, auto& gi) { gi = g * (T(1) - y.square()); });
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_activation_kernels() {
  using K = Activation<Cpu>;
  return std::tuple{
      &K::relu<T>, &K::relu_backward<T>, &K::leaky_relu<T>, &K::leaky_relu_backward<T>,
      &K::gelu<T>, &K::gelu_backward<T>, &K::sigmoid<T>,    &K::sigmoid_backward<T>,
      &K::tanh<T>, &K::tanh_backward<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_activation_kernels)

}  // namespace rg::kernels
