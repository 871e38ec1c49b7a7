// Activations: forward and backward through kernels::cpu::activation or kernels::cuda::activation.
// Each backward saves what its derivative needs: the output for relu/sigmoid/tanh, the input for
// leaky_relu/gelu.
#include "engine/ops/activation.h"

#include "engine/autograd/function.h"
#include "engine/dispatch.h"
#include "engine/ops/check.h"
#include "kernels/cpu/activation.h"
#include "kernels/cuda/activation.h"

namespace rg {

using autograd::SavedTensor;
namespace kcpu = kernels::cpu;
namespace kcuda = kernels::cuda;

namespace {

// kernel.template operator()<T, B>(in, out, n, stream) on x's device and dtype; stream is
// null on the CPU.
template <class F>
Tensor activation_forward(const char* name, const Tensor& x, F&& kernel) {
  check_inputs(name, {x});
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  void* stream = x.device().is_cuda() ? cuda_stream(x) : nullptr;
  dispatch_on(x.device(), x.dtype(), name, [&]<class T, class B>() {
    kernel.template operator()<T, B>(x.data<T>(), out.data<T>(), x.numel(), stream);
  });
  return out;
}

// kernel.template operator()<T, B>(grad, saved, grad_in, n, stream) for a backward kernel
// that reads one saved tensor.
template <class F>
std::vector<Tensor> activation_backward(const char* name, const Tensor& grad, const Tensor& saved,
                                        F&& kernel) {
  Tensor grad_in = Tensor::empty(saved.shape(), saved.dtype(), saved.device());
  void* stream = saved.device().is_cuda() ? cuda_stream(saved) : nullptr;
  dispatch_on(saved.device(), saved.dtype(), name, [&]<class T, class B>() {
    kernel.template operator()<T, B>(grad.data<T>(), saved.data<T>(), grad_in.data<T>(),
                                         saved.numel(), stream);
  });
  return {grad_in};
}

}  // namespace

Tensor relu(const Tensor& x) {
  Tensor out =
      activation_forward("relu", x, []<class T, class B>(const T* in, T* o, int64_t n, void* s) {
        if constexpr (kOnCuda<B>)
          kcuda::relu<T>(in, o, n, s);
        else
          kcpu::relu<T>(in, o, n);
      });
  return autograd::record(out, "ReluBackward", {x}, [so = SavedTensor(out)](const Tensor& g) {
    return activation_backward(
        "relu_backward", g, so.get(),
        []<class T, class B>(const T* gp, const T* y, T* gi, int64_t n, void* s) {
          if constexpr (kOnCuda<B>)
            kcuda::relu_backward<T>(gp, y, gi, n, s);
          else
            kcpu::relu_backward<T>(gp, y, gi, n);
        });
  });
}

Tensor leaky_relu(const Tensor& x, double negative_slope) {
  Tensor out = activation_forward(
      "leaky_relu", x,
      [negative_slope]<class T, class B>(const T* in, T* o, int64_t n, void* s) {
        if constexpr (kOnCuda<B>)
          kcuda::leaky_relu<T>(in, o, n, negative_slope, s);
        else
          kcpu::leaky_relu<T>(in, o, n, T(negative_slope));
      });
  return autograd::record(out, "LeakyReluBackward", {x},
                          [sx = SavedTensor(x), negative_slope](const Tensor& g) {
                            return activation_backward(
                                "leaky_relu_backward", g, sx.get(),
                                [negative_slope]<class T, class B>(const T* gp, const T* in,
                                                                      T* gi, int64_t n, void* s) {
                                  if constexpr (kOnCuda<B>)
                                    kcuda::leaky_relu_backward<T>(gp, in, gi, n, negative_slope, s);
                                  else
                                    kcpu::leaky_relu_backward<T>(gp, in, gi, n, T(negative_slope));
                                });
                          });
}

Tensor gelu(const Tensor& x, bool approximate) {
  Tensor out = activation_forward(
      "gelu", x, [approximate]<class T, class B>(const T* in, T* o, int64_t n, void* s) {
        if constexpr (kOnCuda<B>)
          kcuda::gelu<T>(in, o, n, approximate, s);
        else
          kcpu::gelu<T>(in, o, n, approximate);
      });
  return autograd::record(
      out, "GeluBackward", {x}, [sx = SavedTensor(x), approximate](const Tensor& g) {
        return activation_backward("gelu_backward", g, sx.get(),
                                   [approximate]<class T, class B>(const T* gp, const T* in,
                                                                      T* gi, int64_t n, void* s) {
                                     if constexpr (kOnCuda<B>)
                                       kcuda::gelu_backward<T>(gp, in, gi, n, approximate, s);
                                     else
                                       kcpu::gelu_backward<T>(gp, in, gi, n, approximate);
                                   });
      });
}

Tensor sigmoid(const Tensor& x) {
  Tensor out = activation_forward("sigmoid", x,
                                  []<class T, class B>(const T* in, T* o, int64_t n, void* s) {
                                    if constexpr (kOnCuda<B>)
                                      kcuda::sigmoid<T>(in, o, n, s);
                                    else
                                      kcpu::sigmoid<T>(in, o, n);
                                  });
  return autograd::record(out, "SigmoidBackward", {x}, [so = SavedTensor(out)](const Tensor& g) {
    return activation_backward(
        "sigmoid_backward", g, so.get(),
        []<class T, class B>(const T* gp, const T* y, T* gi, int64_t n, void* s) {
          if constexpr (kOnCuda<B>)
            kcuda::sigmoid_backward<T>(gp, y, gi, n, s);
          else
            kcpu::sigmoid_backward<T>(gp, y, gi, n);
        });
  });
}

Tensor tanh(const Tensor& x) {
  Tensor out =
      activation_forward("tanh", x, []<class T, class B>(const T* in, T* o, int64_t n, void* s) {
        if constexpr (kOnCuda<B>)
          kcuda::tanh<T>(in, o, n, s);
        else
          kcpu::tanh<T>(in, o, n);
      });
  return autograd::record(out, "TanhBackward", {x}, [so = SavedTensor(out)](const Tensor& g) {
    return activation_backward(
        "tanh_backward", g, so.get(),
        []<class T, class B>(const T* gp, const T* y, T* gi, int64_t n, void* s) {
          if constexpr (kOnCuda<B>)
            kcuda::tanh_backward<T>(gp, y, gi, n, s);
          else
            kcpu::tanh_backward<T>(gp, y, gi, n);
        });
  });
}

}  // namespace rg
