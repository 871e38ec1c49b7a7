// Activations: forward and backward through kernels::cpu::activation. Each backward saves what its
// derivative needs: the output for relu/sigmoid/tanh, the input for leaky_relu/gelu.
#include "engine/ops/activation.h"

#include "engine/autograd/function.h"
#include "engine/dispatch.h"
#include "engine/ops/check.h"
#include "kernels/cpu/activation.h"

namespace rg {

using autograd::SavedTensor;

namespace {

// Runs kernel(in, out, n), a lambda templated on the element type, on x's dtype.
template <class F>
Tensor activation_forward(const char* name, const Tensor& x, F&& kernel) {
  check_inputs(name, {x});
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch_float(x.dtype(), name,
                 [&]<class T>() { kernel(x.data<T>(), out.data<T>(), x.numel()); });
  return out;
}

// Runs kernel(grad, saved, grad_in, n) for a backward kernel that reads one saved tensor.
template <class F>
std::vector<Tensor> activation_backward(const char* name, const Tensor& grad, const Tensor& saved,
                                        F&& kernel) {
  Tensor grad_in = Tensor::empty(saved.shape(), saved.dtype(), saved.device());
  dispatch_float(saved.dtype(), name, [&]<class T>() {
    kernel(grad.data<T>(), saved.data<T>(), grad_in.data<T>(), saved.numel());
  });
  return {grad_in};
}

}  // namespace

Tensor relu(const Tensor& x) {
  Tensor out = activation_forward(
      "relu", x, []<class T>(const T* in, T* o, int64_t n) { kernels::cpu::relu<T>(in, o, n); });
  return autograd::record(out, "ReluBackward", {x}, [so = SavedTensor(out)](const Tensor& g) {
    return activation_backward("relu_backward", g, so.get(),
                               []<class T>(const T* gp, const T* y, T* gi, int64_t n) {
                                 kernels::cpu::relu_backward<T>(gp, y, gi, n);
                               });
  });
}

Tensor leaky_relu(const Tensor& x, double negative_slope) {
  Tensor out =
      activation_forward("leaky_relu", x, [negative_slope]<class T>(const T* in, T* o, int64_t n) {
        kernels::cpu::leaky_relu<T>(in, o, n, T(negative_slope));
      });
  return autograd::record(
      out, "LeakyReluBackward", {x}, [sx = SavedTensor(x), negative_slope](const Tensor& g) {
        return activation_backward(
            "leaky_relu_backward", g, sx.get(),
            [negative_slope]<class T>(const T* gp, const T* in, T* gi, int64_t n) {
              kernels::cpu::leaky_relu_backward<T>(gp, in, gi, n, T(negative_slope));
            });
      });
}

Tensor gelu(const Tensor& x, bool approximate) {
  Tensor out = activation_forward("gelu", x, [approximate]<class T>(const T* in, T* o, int64_t n) {
    kernels::cpu::gelu<T>(in, o, n, approximate);
  });
  return autograd::record(out, "GeluBackward", {x},
                          [sx = SavedTensor(x), approximate](const Tensor& g) {
                            return activation_backward(
                                "gelu_backward", g, sx.get(),
                                [approximate]<class T>(const T* gp, const T* in, T* gi, int64_t n) {
                                  kernels::cpu::gelu_backward<T>(gp, in, gi, n, approximate);
                                });
                          });
}

Tensor sigmoid(const Tensor& x) {
  Tensor out = activation_forward("sigmoid", x, []<class T>(const T* in, T* o, int64_t n) {
    kernels::cpu::sigmoid<T>(in, o, n);
  });
  return autograd::record(out, "SigmoidBackward", {x}, [so = SavedTensor(out)](const Tensor& g) {
    return activation_backward("sigmoid_backward", g, so.get(),
                               []<class T>(const T* gp, const T* y, T* gi, int64_t n) {
                                 kernels::cpu::sigmoid_backward<T>(gp, y, gi, n);
                               });
  });
}

Tensor tanh(const Tensor& x) {
  Tensor out = activation_forward(
      "tanh", x, []<class T>(const T* in, T* o, int64_t n) { kernels::cpu::tanh<T>(in, o, n); });
  return autograd::record(out, "TanhBackward", {x}, [so = SavedTensor(out)](const Tensor& g) {
    return activation_backward("tanh_backward", g, so.get(),
                               []<class T>(const T* gp, const T* y, T* gi, int64_t n) {
                                 kernels::cpu::tanh_backward<T>(gp, y, gi, n);
                               });
  });
}

}  // namespace rg
