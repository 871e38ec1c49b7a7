// Activations with Eigen array maps, parallel over chunks; backward kernels fuse the derivative
// with the multiplication by the incoming gradient.
#include "kernels/cpu/activation.h"

#include <numbers>
#include <unsupported/Eigen/SpecialFunctions>

#include "kernels/cpu/eigen_maps.h"
#include "kernels/cpu/parallel.h"

namespace rg::kernels::cpu {
namespace {
constexpr int64_t kGrain = 1 << 14;

// Runs fn(x_chunk, out_chunk) over parallel chunks of two arrays.
template <class T, class F>
void map1(const T* x, T* out, int64_t n, F&& fn) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    ArrayMap<T> o(out + lo, hi - lo);
    fn(ConstArrayMap<T>(x + lo, hi - lo), o);
  });
}

// Runs fn(grad_chunk, saved_chunk, grad_in_chunk) over parallel chunks of three arrays.
template <class T, class F>
void map2(const T* grad, const T* saved, T* grad_in, int64_t n, F&& fn) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    ArrayMap<T> gi(grad_in + lo, hi - lo);
    fn(ConstArrayMap<T>(grad + lo, hi - lo), ConstArrayMap<T>(saved + lo, hi - lo), gi);
  });
}

// PyTorch's GELU constants.
constexpr double kSqrt1_2 = 1.0 / std::numbers::sqrt2;                           // 1/sqrt(2)
constexpr double kInvSqrt2Pi = std::numbers::inv_sqrtpi / std::numbers::sqrt2;   // 1/sqrt(2 pi)
constexpr double kSqrt2OverPi = std::numbers::sqrt2 * std::numbers::inv_sqrtpi;  // sqrt(2/pi)
constexpr double kKappa = 0.044715;
}  // namespace

template <class T>
void relu(const T* x, T* out, int64_t n) {
  // select(x < 0) rather than max(x, 0) so that NaN inputs stay NaN.
  map1(x, out, n, [](const auto& a, auto& o) { o = (a < T(0)).select(T(0), a); });
}

template <class T>
void relu_backward(const T* grad, const T* out, T* grad_in, int64_t n) {
  map2(grad, out, grad_in, n,
       [](const auto& g, const auto& y, auto& gi) { gi = (y > T(0)).select(g, T(0)); });
}

template <class T>
void leaky_relu(const T* x, T* out, int64_t n, T negative_slope) {
  // max/min instead of select: both sides are then computed unconditionally, which vectorizes
  // (a select whose else-branch multiplies compiles to a mispredicted branch per element).
  // NaN propagates through both, as in PyTorch.
  map1(x, out, n, [negative_slope](const auto& a, auto& o) {
    o = a.max(T(0)) + negative_slope * a.min(T(0));
  });
}

template <class T>
void leaky_relu_backward(const T* grad, const T* x, T* grad_in, int64_t n, T negative_slope) {
  // A plain loop choosing between two constants: that vectorizes, while a select between g and
  // g * slope (in Eigen or in a loop) becomes a branch per element.
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T slope = x[i] > T(0) ? T(1) : negative_slope;
      grad_in[i] = grad[i] * slope;
    }
  });
}

template <class T>
void gelu(const T* x, T* out, int64_t n, bool approximate) {
  if (approximate) {
    map1(x, out, n, [](const auto& a, auto& o) {
      const auto inner = T(kSqrt2OverPi) * (a + T(kKappa) * a.cube());
      o = T(0.5) * a * (T(1) + inner.tanh());
    });
  } else {
    map1(x, out, n,
         [](const auto& a, auto& o) { o = T(0.5) * a * (T(1) + (a * T(kSqrt1_2)).erf()); });
  }
}

template <class T>
void gelu_backward(const T* grad, const T* x, T* grad_in, int64_t n, bool approximate) {
  if (approximate) {
    map2(grad, x, grad_in, n, [](const auto& g, const auto& a, auto& gi) {
      const Eigen::Array<T, Eigen::Dynamic, 1> t =
          (T(kSqrt2OverPi) * (a + T(kKappa) * a.cube())).tanh();
      const auto inner_derivative = T(kSqrt2OverPi) * (T(1) + T(3 * kKappa) * a.square());
      gi = g * (T(0.5) * (T(1) + t) + T(0.5) * a * (T(1) - t.square()) * inner_derivative);
    });
  } else {
    // d/dx [x Phi(x)] = Phi(x) + x phi(x)
    map2(grad, x, grad_in, n, [](const auto& g, const auto& a, auto& gi) {
      const auto cdf = T(0.5) * (T(1) + (a * T(kSqrt1_2)).erf());
      const auto pdf = T(kInvSqrt2Pi) * (T(-0.5) * a.square()).exp();
      gi = g * (cdf + a * pdf);
    });
  }
}

template <class T>
void sigmoid(const T* x, T* out, int64_t n) {
  // exp(-x) overflows to inf for very negative x, which correctly gives 0.
  map1(x, out, n, [](const auto& a, auto& o) { o = (T(1) + (-a).exp()).inverse(); });
}

template <class T>
void sigmoid_backward(const T* grad, const T* out, T* grad_in, int64_t n) {
  map2(grad, out, grad_in, n,
       [](const auto& g, const auto& y, auto& gi) { gi = g * y * (T(1) - y); });
}

template <class T>
void tanh(const T* x, T* out, int64_t n) {
  map1(x, out, n, [](const auto& a, auto& o) { o = a.tanh(); });
}

template <class T>
void tanh_backward(const T* grad, const T* out, T* grad_in, int64_t n) {
  map2(grad, out, grad_in, n,
       [](const auto& g, const auto& y, auto& gi) { gi = g * (T(1) - y.square()); });
}

#define RG_INSTANTIATE_ACTIVATION(T)                                        \
  template void relu<T>(const T*, T*, int64_t);                             \
  template void relu_backward<T>(const T*, const T*, T*, int64_t);          \
  template void leaky_relu<T>(const T*, T*, int64_t, T);                    \
  template void leaky_relu_backward<T>(const T*, const T*, T*, int64_t, T); \
  template void gelu<T>(const T*, T*, int64_t, bool);                       \
  template void gelu_backward<T>(const T*, const T*, T*, int64_t, bool);    \
  template void sigmoid<T>(const T*, T*, int64_t);                          \
  template void sigmoid_backward<T>(const T*, const T*, T*, int64_t);       \
  template void tanh<T>(const T*, T*, int64_t);                             \
  template void tanh_backward<T>(const T*, const T*, T*, int64_t);
RG_INSTANTIATE_ACTIVATION(float)
RG_INSTANTIATE_ACTIVATION(double)
#undef RG_INSTANTIATE_ACTIVATION

}  // namespace rg::kernels::cpu
