// Activations: forward and backward through kernels/activation.h, one call per kernel on both
// devices. Each backward saves what its derivative needs: the output for relu/sigmoid/tanh, the
// input for leaky_relu/gelu.
#include "engine/ops/activation.h"

#include <utility>

#include "engine/autograd/function.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "kernels/activation.h"

namespace rg {

using autograd::SavedTensor;

namespace {

// kernel.template operator()<T, K>(in, out, n, ctx) on x's device and dtype, K being
// kernels::Activation<B>; `in_place` writes the result over x (the kernel is elementwise).
template <class F>
Tensor activation_forward(const char* name, const Tensor& x, F&& kernel, bool in_place = false) {
  check_inputs(name, {x}, Formats::alike);
  Tensor out = in_place ? x.detach() : empty_like(x);
  dispatch_on(x.device(), x.dtype(), name, [&]<class T, class B>() {
    kernel.template operator()<T, kernels::Activation<B>>(x.data<T>(), out.data<T>(), x.numel(),
                                                          kernel_ctx(x));
  });
  if (in_place) out.bump_version();
  return out;
}

// kernel.template operator()<T, K>(grad, saved, grad_in, n, ctx) for a backward kernel that
// reads one saved tensor; `in_place` writes grad_in over grad (the kernel is elementwise).
template <class F>
std::vector<Tensor> activation_backward(const char* name, const Tensor& grad, const Tensor& saved,
                                        F&& kernel, bool in_place = false) {
  Tensor grad_in = in_place ? grad.detach() : empty_like(saved);
  dispatch_on(saved.device(), saved.dtype(), name, [&]<class T, class B>() {
    kernel.template operator()<T, kernels::Activation<B>>(
        grad.data<T>(), saved.data<T>(), grad_in.data<T>(), saved.numel(), kernel_ctx(saved));
  });
  return {grad_in};
}

using kernels::Ctx;

// relu over x, written over x's buffer when `in_place`.
Tensor relu_impl(const Tensor& x, bool in_place) {
  Tensor out = activation_forward(
      "relu", x,
      []<class T, class K>(const T* in, T* o, int64_t n, Ctx ctx) { K::relu(in, o, n, ctx); },
      in_place);
  // The engine hands each node a gradient buffer that it drops afterwards (Node::apply), so one
  // that nothing else holds can take the input gradient.
  return autograd::record(out, "ReluBackward", {x}, [so = SavedTensor(out)](const Tensor& g) {
    return activation_backward(
        "relu_backward", g, so.get(),
        []<class T, class K>(const T* gp, const T* y, T* gi, int64_t n, Ctx ctx) {
          K::relu_backward(gp, y, gi, n, ctx);
        },
        reusable(g) && g.shape() == so.get().shape());
  });
}

}  // namespace

Tensor relu(const Tensor& x) {
  if (cpu_half_inputs({x})) return relu(half_to_f32(x)).to(x.dtype());
  return relu_impl(x, false);
}
Tensor relu(Tensor&& x) {
  if (cpu_half_inputs({x})) return relu(half_to_f32(x)).to(x.dtype());
  const Tensor owned = std::move(x);  // the caller's handle is given up, as with any move
  return relu_impl(owned, reusable(owned));
}

Tensor leaky_relu(const Tensor& x, double negative_slope) {
  if (cpu_half_inputs({x})) return leaky_relu(half_to_f32(x), negative_slope).to(x.dtype());
  Tensor out = activation_forward(
      "leaky_relu", x, [negative_slope]<class T, class K>(const T* in, T* o, int64_t n, Ctx ctx) {
        K::leaky_relu(in, o, n, negative_slope, ctx);
      });
  return autograd::record(
      out, "LeakyReluBackward", {x}, [sx = SavedTensor(x), negative_slope](const Tensor& g) {
        return activation_backward("leaky_relu_backward", g, sx.get(),
                                   [negative_slope]<class T, class K>(const T* gp, const T* in,
                                                                      T* gi, int64_t n, Ctx ctx) {
                                     K::leaky_relu_backward(gp, in, gi, n, negative_slope, ctx);
                                   });
      });
}

Tensor gelu(const Tensor& x, bool approximate) {
  if (cpu_half_inputs({x})) return gelu(half_to_f32(x), approximate).to(x.dtype());
  Tensor out = activation_forward(
      "gelu", x, [approximate]<class T, class K>(const T* in, T* o, int64_t n, Ctx ctx) {
        K::gelu(in, o, n, approximate, ctx);
      });
  return autograd::record(
      out, "GeluBackward", {x}, [sx = SavedTensor(x), approximate](const Tensor& g) {
        return activation_backward(
            "gelu_backward", g, sx.get(),
            [approximate]<class T, class K>(const T* gp, const T* in, T* gi, int64_t n, Ctx ctx) {
              K::gelu_backward(gp, in, gi, n, approximate, ctx);
            });
      });
}

Tensor sigmoid(const Tensor& x) {
  if (cpu_half_inputs({x})) return sigmoid(half_to_f32(x)).to(x.dtype());
  Tensor out = activation_forward(
      "sigmoid", x,
      []<class T, class K>(const T* in, T* o, int64_t n, Ctx ctx) { K::sigmoid(in, o, n, ctx); });
  return autograd::record(out, "SigmoidBackward", {x}, [so = SavedTensor(out)](const Tensor& g) {
    return activation_backward(
        "sigmoid_backward", g, so.get(),
        []<class T, class K>(const T* gp, const T* y, T* gi, int64_t n, Ctx ctx) {
          K::sigmoid_backward(gp, y, gi, n, ctx);
        });
  });
}

Tensor tanh(const Tensor& x) {
  if (cpu_half_inputs({x})) return tanh(half_to_f32(x)).to(x.dtype());
  Tensor out = activation_forward(
      "tanh", x,
      []<class T, class K>(const T* in, T* o, int64_t n, Ctx ctx) { K::tanh(in, o, n, ctx); });
  return autograd::record(out, "TanhBackward", {x}, [so = SavedTensor(out)](const Tensor& g) {
    return activation_backward(
        "tanh_backward", g, so.get(),
        []<class T, class K>(const T* gp, const T* y, T* gi, int64_t n, Ctx ctx) {
          K::tanh_backward(gp, y, gi, n, ctx);
        });
  });
}

}  // namespace rg
