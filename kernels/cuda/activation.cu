// The activation kernels on CUDA (kernels/activation.h): one grid-stride map kernel for forwards
// and one for backwards, each instantiated with a functor holding the formula.
#include <tuple>

#include "kernels/activation.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise_common.cuh"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::kernels {
namespace {

using namespace cuda::detail;

constexpr double kSqrt1_2 = detail::kGeluSqrt1_2;
constexpr double kInvSqrt2Pi = detail::kGeluInvSqrt2Pi;
constexpr double kSqrt2OverPi = detail::kGeluSqrt2OverPi;
constexpr double kKappa = detail::kGeluKappa;

// out[i] = op(x[i])
template <class Op, class D>
__global__ void map1_kernel(const D* x, D* out, int64_t n, Op op) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) out[i] = store<D>(op(load(x[i])));
}

// grad_in[i] = op(grad[i], saved[i]), saved being the forward's input or output.
template <class Op, class D>
__global__ void map2_kernel(const D* grad, const D* saved, D* grad_in, int64_t n, Op op) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    grad_in[i] = store<D>(op(load(grad[i]), load(saved[i])));
  }
}

struct Relu {
  // x < 0 rather than max(x, 0) so that NaN stays NaN.
  template <class A>
  __device__ A operator()(A x) const {
    return x < A(0) ? A(0) : x;
  }
};
struct ReluBackward {
  template <class A>
  __device__ A operator()(A g, A y) const {
    return y > A(0) ? g : A(0);
  }
};

template <class A>
struct LeakyRelu {
  A slope;
  __device__ A operator()(A x) const { return x * (x > A(0) ? A(1) : slope); }
};
template <class A>
struct LeakyReluBackward {
  A slope;
  __device__ A operator()(A g, A x) const { return g * (x > A(0) ? A(1) : slope); }
};

template <bool kApproximate>
struct Gelu {
  template <class A>
  __device__ A operator()(A x) const {
    if constexpr (kApproximate) {
      const A inner = A(kSqrt2OverPi) * (x + A(kKappa) * (x * x * x));
      return A(0.5) * x * (A(1) + tanh_(inner));
    } else {
      return A(0.5) * x * (A(1) + erf_(x * A(kSqrt1_2)));
    }
  }
};
template <bool kApproximate>
struct GeluBackward {
  template <class A>
  __device__ A operator()(A g, A x) const {
    if constexpr (kApproximate) {
      const A t = tanh_(A(kSqrt2OverPi) * (x + A(kKappa) * (x * x * x)));
      const A inner_derivative = A(kSqrt2OverPi) * (A(1) + A(3 * kKappa) * (x * x));
      return g * (A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * inner_derivative);
    } else {
      // d/dx [x Phi(x)] = Phi(x) + x phi(x)
      const A cdf = A(0.5) * (A(1) + erf_(x * A(kSqrt1_2)));
      const A pdf = A(kInvSqrt2Pi) * exp_(A(-0.5) * (x * x));
      return g * (cdf + x * pdf);
    }
  }
};

struct Sigmoid {
  // exp(-x) overflows to inf for very negative x, which correctly gives 0.
  template <class A>
  __device__ A operator()(A x) const {
    return A(1) / (A(1) + exp_(-x));
  }
};
struct SigmoidBackward {
  template <class A>
  __device__ A operator()(A g, A y) const {
    return g * y * (A(1) - y);
  }
};

struct Tanh {
  template <class A>
  __device__ A operator()(A x) const {
    return tanh_(x);
  }
};
struct TanhBackward {
  template <class A>
  __device__ A operator()(A g, A y) const {
    return g * (A(1) - y * y);
  }
};

template <class Op, class T>
void map1(const char* name, const T* x, T* out, int64_t n, Op op, void* stream) {
  if (!detail::check_activation_size(name, n)) return;
  using D = device_t<T>;
  RG_LAUNCH((map1_kernel<Op, D>), blocks_for(n), kThreads, 0, as_stream(stream), dev(x), dev(out),
            n, op);
}

template <class Op, class T>
void map2(const char* name, const T* grad, const T* saved, T* grad_in, int64_t n, Op op,
          void* stream) {
  if (!detail::check_activation_size(name, n)) return;
  using D = device_t<T>;
  RG_LAUNCH((map2_kernel<Op, D>), blocks_for(n), kThreads, 0, as_stream(stream), dev(grad),
            dev(saved), dev(grad_in), n, op);
}

template <class T>
using acc_t = compute_t<device_t<T>>;

}  // namespace

template <>
template <class T>
void Activation<Cuda>::relu(const T* x, T* out, int64_t n, Ctx ctx) {
  map1("relu", x, out, n, Relu{}, ctx.stream);
}
template <>
template <class T>
void Activation<Cuda>::relu_backward(const T* grad, const T* out, T* grad_in, int64_t n, Ctx ctx) {
  map2("relu_backward", grad, out, grad_in, n, ReluBackward{}, ctx.stream);
}

template <>
template <class T>
void Activation<Cuda>::leaky_relu(const T* x, T* out, int64_t n, double negative_slope, Ctx ctx) {
  map1("leaky_relu", x, out, n, LeakyRelu<acc_t<T>>{static_cast<acc_t<T>>(negative_slope)},
       ctx.stream);
}
template <>
template <class T>
void Activation<Cuda>::leaky_relu_backward(const T* grad, const T* x, T* grad_in, int64_t n,
                                           double negative_slope, Ctx ctx) {
  map2("leaky_relu_backward", grad, x, grad_in, n,
       LeakyReluBackward<acc_t<T>>{static_cast<acc_t<T>>(negative_slope)}, ctx.stream);
}

template <>
template <class T>
void Activation<Cuda>::gelu(const T* x, T* out, int64_t n, bool approximate, Ctx ctx) {
  if (approximate) {
    map1("gelu", x, out, n, Gelu<true>{}, ctx.stream);
  } else {
    map1("gelu", x, out, n, Gelu<false>{}, ctx.stream);
  }
}
template <>
template <class T>
void Activation<Cuda>::gelu_backward(const T* grad, const T* x, T* grad_in, int64_t n,
                                     bool approximate, Ctx ctx) {
  if (approximate) {
    map2("gelu_backward", grad, x, grad_in, n, GeluBackward<true>{}, ctx.stream);
  } else {
    map2("gelu_backward", grad, x, grad_in, n, GeluBackward<false>{}, ctx.stream);
  }
}

template <>
template <class T>
void Activation<Cuda>::sigmoid(const T* x, T* out, int64_t n, Ctx ctx) {
  map1("sigmoid", x, out, n, Sigmoid{}, ctx.stream);
}
template <>
template <class T>
void Activation<Cuda>::sigmoid_backward(const T* grad, const T* out, T* grad_in, int64_t n,
                                        Ctx ctx) {
  map2("sigmoid_backward", grad, out, grad_in, n, SigmoidBackward{}, ctx.stream);
}

template <>
template <class T>
void Activation<Cuda>::tanh(const T* x, T* out, int64_t n, Ctx ctx) {
  map1("tanh", x, out, n, Tanh{}, ctx.stream);
}
template <>
template <class T>
void Activation<Cuda>::tanh_backward(const T* grad, const T* out, T* grad_in, int64_t n, Ctx ctx) {
  map2("tanh_backward", grad, out, grad_in, n, TanhBackward{}, ctx.stream);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_activation_kernels() {
  using K = Activation<Cuda>;
  return std::tuple{
      &K::relu<T>, &K::relu_backward<T>, &K::leaky_relu<T>, &K::leaky_relu_backward<T>,
      &K::gelu<T>, &K::gelu_backward<T>, &K::sigmoid<T>,    &K::sigmoid_backward<T>,
      &K::tanh<T>, &K::tanh_backward<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_activation_kernels)

}  // namespace rg::kernels
