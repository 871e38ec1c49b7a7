// neg/exp/log/sqrt/pow forward through kernels/unary.h's Unary<B>, with their derivatives.
#include "engine/ops/unary.h"

#include "engine/autograd/function.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/binary.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "kernels/unary.h"

namespace rg {

using autograd::SavedTensor;
using kernels::UnaryOp;

namespace {
Tensor unary_forward(UnaryOp op, const char* name, const Tensor& x) {
  check_inputs(name, {x}, Formats::alike);
  Tensor out = empty_like(x);
  dispatch_on(x.device(), x.dtype(), name, [&]<class T, class B>() {
    kernels::Unary<B>::unary(op, x.data<T>(), out.data<T>(), x.numel(), kernel_ctx(x));
  });
  return out;
}
}  // namespace

Tensor neg(const Tensor& x) {
  if (cpu_half_inputs({x})) return neg(half_to_f32(x)).to(x.dtype());
  Tensor out = unary_forward(UnaryOp::neg, "neg", x);
  return autograd::record(out, "NegBackward", {x},
                          [](const Tensor& g) { return std::vector<Tensor>{neg(g)}; });
}

Tensor exp(const Tensor& x) {
  if (auto c = autocast_inputs(AutocastPolicy::f32, {x})) return exp((*c)[0]);
  if (cpu_half_inputs({x})) return exp(half_to_f32(x)).to(x.dtype());
  Tensor out = unary_forward(UnaryOp::exp, "exp", x);
  return autograd::record(out, "ExpBackward", {x}, [so = SavedTensor(out)](const Tensor& g) {
    return std::vector<Tensor>{mul(g, so.get())};
  });
}

Tensor log(const Tensor& x) {
  if (auto c = autocast_inputs(AutocastPolicy::f32, {x})) return log((*c)[0]);
  if (cpu_half_inputs({x})) return log(half_to_f32(x)).to(x.dtype());
  Tensor out = unary_forward(UnaryOp::log, "log", x);
  return autograd::record(out, "LogBackward", {x}, [sx = SavedTensor(x)](const Tensor& g) {
    return std::vector<Tensor>{div(g, sx.get())};
  });
}

Tensor sqrt(const Tensor& x) {
  if (cpu_half_inputs({x})) return sqrt(half_to_f32(x)).to(x.dtype());
  Tensor out = unary_forward(UnaryOp::sqrt, "sqrt", x);
  return autograd::record(out, "SqrtBackward", {x}, [so = SavedTensor(out)](const Tensor& g) {
    return std::vector<Tensor>{div(g, mul(so.get(), 2.0))};
  });
}

Tensor pow(const Tensor& x, double exponent) {
  if (auto c = autocast_inputs(AutocastPolicy::f32, {x})) return pow((*c)[0], exponent);
  if (cpu_half_inputs({x})) return pow(half_to_f32(x), exponent).to(x.dtype());
  check_inputs("pow", {x}, Formats::alike);
  Tensor out = empty_like(x);
  dispatch_on(x.device(), x.dtype(), "pow", [&]<class T, class B>() {
    kernels::Unary<B>::pow_scalar(x.data<T>(), exponent, out.data<T>(), x.numel(), kernel_ctx(x));
  });
  return autograd::record(
      out, "PowBackward", {x}, [sx = SavedTensor(x), exponent](const Tensor& g) {
        if (exponent == 0.0) return std::vector<Tensor>{mul(g, 0.0)};
        return std::vector<Tensor>{mul(mul(g, pow(sx.get(), exponent - 1.0)), exponent)};
      });
}

}  // namespace rg
