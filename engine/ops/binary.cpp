// add/sub/mul/div: forward through kernels/binary.h's Binary<B> (same shape, per-channel block,
// or general strided broadcast; the same choice on both devices), backward reduces broadcast
// gradients back to each input's shape with sum_to.
#include "engine/ops/binary.h"

#include <algorithm>
#include <utility>

#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "engine/ops/reduce.h"
#include "engine/ops/unary.h"
#include "kernels/binary.h"
#include "kernels/error.h"

namespace rg {

using autograd::SavedTensor;
using kernels::BinaryOp;

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    RG_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

const char* op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add:
      return "add";
    case BinaryOp::sub:
      return "sub";
    case BinaryOp::mul:
      return "mul";
    case BinaryOp::div:
      return "div";
  }
  return "?";
}

// Element strides of `s` read as `out`'s shape (0 where broadcast).
std::vector<int64_t> broadcast_strides(const Shape& s, const Shape& out) {
  std::vector<int64_t> strides(out.size(), 0);
  int64_t stride = 1;
  for (size_t k = 0; k < s.size(); ++k) {
    const size_t i = s.size() - 1 - k;
    const size_t o = out.size() - 1 - k;
    strides[o] = s[i] == 1 ? 0 : stride;
    stride *= s[i];
  }
  return strides;
}

// b's broadcast read as out[o, c, i] = a[o, c, i] op b[c]: true when a has out's shape and b's
// non-1 dimensions (right-aligned) form one contiguous block [first, last) of out's dimensions.
// Covers a scalar b (channels = 1), a bias [cols] and per-channel [C, 1, 1] operands.
bool channel_block(const Shape& b, const Shape& out, int64_t& outer, int64_t& channels,
                   int64_t& inner) {
  const size_t lead = out.size() - b.size();
  size_t first = out.size(), last = out.size();
  for (size_t i = 0; i < b.size(); ++i) {
    if (b[i] == 1) continue;
    if (first == out.size())
      first = lead + i;
    else if (last != lead + i)
      return false;  // a gap of 1s inside the block
    last = lead + i + 1;
  }
  if (first == out.size()) first = last = out.size();
  outer = channels = inner = 1;
  for (size_t i = 0; i < out.size(); ++i)
    (i < first ? outer : i < last ? channels : inner) *= out[i];
  return true;
}

// `a_reusable`: the result may be written over a (reusable() in engine/ops/check.h), which happens
// when it has a's shape; every form below reads each element of a only for the same element of
// the result.
Tensor binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, bool a_reusable = false) {
  const char* name = op_name(op);
  if (a.shape() == b.shape() && a.memory_format() != b.memory_format()) {
    const NoGradGuard no_grad;  // the op records {a, b}: b's gradient goes back in b's format
    return binary_forward(op, a, b.detach().contiguous(a.memory_format()), a_reusable);
  }
  // Elementwise on equal shapes in either format (the result takes a's); broadcasting reads by
  // position.
  RG_CHECK(a.shape() == b.shape() || (a.memory_format() == MemoryFormat::contiguous &&
                                      b.memory_format() == MemoryFormat::contiguous),
           name, ": broadcasting ", shape_str(a.shape()), " with ", shape_str(b.shape()),
           " reads memory by position and takes contiguous tensors only, but input ",
           a.memory_format() == MemoryFormat::contiguous ? 1 : 0,
           " is channels_last; call .contiguous() first (equal shapes take either format)");
  check_inputs(name, {a, b}, Formats::alike);
  const Shape shape =
      a.shape() == b.shape() ? a.shape() : broadcast_shapes(a.shape(), b.shape(), name);
  const bool in_place = a_reusable && shape == a.shape();
  Tensor out = in_place             ? a.detach()
               : shape == a.shape() ? empty_like(a)
                                    : Tensor::empty(shape, a.dtype(), a.device());
  int64_t outer = 0, channels = 0, inner = 0;
  dispatch_on(a.device(), a.dtype(), name, [&]<class T, class B>() {
    using K = kernels::Binary<B>;
    const kernels::Ctx ctx = kernel_ctx(a);
    if (a.shape() == b.shape()) {
      K::binary(op, a.data<T>(), b.data<T>(), out.data<T>(), a.numel(), ctx);
    } else if (a.shape() == shape && channel_block(b.shape(), shape, outer, channels, inner)) {
      K::binary_per_channel(op, a.data<T>(), b.data<T>(), out.data<T>(), outer, channels, inner,
                            false, ctx);
    } else if (b.shape() == shape && channel_block(a.shape(), shape, outer, channels, inner)) {
      K::binary_per_channel(op, b.data<T>(), a.data<T>(), out.data<T>(), outer, channels, inner,
                            true, ctx);
    } else {
      const auto as = broadcast_strides(a.shape(), shape);
      const auto bs = broadcast_strides(b.shape(), shape);
      K::binary_broadcast(op, a.data<T>(), as.data(), b.data<T>(), bs.data(), out.data<T>(),
                          shape.data(), int(shape.size()), ctx);
    }
  });
  if (in_place) out.bump_version();
  return out;
}

Tensor scalar_forward(BinaryOp op, const Tensor& a, double s, bool scalar_first) {
  const char* name = op_name(op);
  check_inputs(name, {a}, Formats::alike);
  Tensor out = empty_like(a);
  dispatch_on(a.device(), a.dtype(), name, [&]<class T, class B>() {
    kernels::Binary<B>::binary_scalar(op, a.data<T>(), s, out.data<T>(), a.numel(), scalar_first,
                                      kernel_ctx(a));
  });
  return out;
}

}  // namespace

namespace {

// Autocast's promotion and the CPU's f16/bf16 route of a tensor-tensor op (autocast_policy.h):
// `op` re-entered with the adjusted inputs, or an undefined tensor when it runs as it is.
template <class Op>
Tensor binary_policy(const char* name, const Tensor& a, const Tensor& b, Op op) {
  if (auto c = autocast_inputs(AutocastPolicy::promote, {a, b})) return op((*c)[0], (*c)[1]);
  check_inputs(name, {a, b}, Formats::any);  // binary_forward checks the formats
  if (cpu_half_inputs({a, b})) return op(half_to_f32(a), half_to_f32(b)).to(a.dtype());
  return Tensor();
}

Tensor add_impl(const Tensor& a, const Tensor& b, bool a_reusable) {
  Tensor out = binary_forward(BinaryOp::add, a, b, a_reusable);
  return autograd::record(out, "AddBackward", {a, b},
                          [sa = a.shape(), sb = b.shape()](const Tensor& g) {
                            return std::vector<Tensor>{sum_to(g, sa), sum_to(g, sb)};
                          });
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  if (Tensor r =
          binary_policy("add", a, b, [](const Tensor& x, const Tensor& y) { return add(x, y); });
      r.defined())
    return r;
  return add_impl(a, b, false);
}
Tensor add(Tensor&& a, const Tensor& b) {
  if (Tensor r =
          binary_policy("add", a, b, [](const Tensor& x, const Tensor& y) { return add(x, y); });
      r.defined())
    return r;
  const Tensor owned = std::move(a);  // the caller's handle is given up, as with any move
  return add_impl(owned, b, reusable(owned));
}

Tensor sub(const Tensor& a, const Tensor& b) {
  if (Tensor r =
          binary_policy("sub", a, b, [](const Tensor& x, const Tensor& y) { return sub(x, y); });
      r.defined())
    return r;
  Tensor out = binary_forward(BinaryOp::sub, a, b);
  return autograd::record(out, "SubBackward", {a, b},
                          [sa = a.shape(), sb = b.shape()](const Tensor& g) {
                            return std::vector<Tensor>{sum_to(g, sa), neg(sum_to(g, sb))};
                          });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (Tensor r =
          binary_policy("mul", a, b, [](const Tensor& x, const Tensor& y) { return mul(x, y); });
      r.defined())
    return r;
  Tensor out = binary_forward(BinaryOp::mul, a, b);
  const bool ga = autograd::needs_grad({a}), gb = autograd::needs_grad({b});
  return autograd::record(out, "MulBackward", {a, b},
                          [sa = SavedTensor(gb ? a : Tensor()), sb = SavedTensor(ga ? b : Tensor()),
                           shape_a = a.shape(), shape_b = b.shape(), ga, gb](const Tensor& g) {
                            return std::vector<Tensor>{
                                ga ? sum_to(mul(g, sb.get()), shape_a) : Tensor(),
                                gb ? sum_to(mul(g, sa.get()), shape_b) : Tensor()};
                          });
}

Tensor div(const Tensor& a, const Tensor& b) {
  if (Tensor r =
          binary_policy("div", a, b, [](const Tensor& x, const Tensor& y) { return div(x, y); });
      r.defined())
    return r;
  Tensor out = binary_forward(BinaryOp::div, a, b);
  const bool gb = autograd::needs_grad({b});
  return autograd::record(
      out, "DivBackward", {a, b},
      [sa = SavedTensor(gb ? a : Tensor()), sb = SavedTensor(b), shape_a = a.shape(),
       shape_b = b.shape(), gb](const Tensor& g) {
        const Tensor bv = sb.get();
        const Tensor ga = sum_to(div(g, bv), shape_a);
        // d(a/b)/db = -a / b^2
        const Tensor gbv = gb ? sum_to(neg(div(mul(g, sa.get()), mul(bv, bv))), shape_b) : Tensor();
        return std::vector<Tensor>{ga, gbv};
      });
}

Tensor add(const Tensor& a, double s) {
  if (cpu_half_inputs({a})) return add(half_to_f32(a), s).to(a.dtype());
  Tensor out = scalar_forward(BinaryOp::add, a, s, false);
  return autograd::record(out, "AddScalarBackward", {a},
                          [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Tensor sub(const Tensor& a, double s) { return add(a, -s); }

Tensor mul(const Tensor& a, double s) {
  if (cpu_half_inputs({a})) return mul(half_to_f32(a), s).to(a.dtype());
  Tensor out = scalar_forward(BinaryOp::mul, a, s, false);
  return autograd::record(out, "MulScalarBackward", {a},
                          [s](const Tensor& g) { return std::vector<Tensor>{mul(g, s)}; });
}

Tensor div(const Tensor& a, double s) { return mul(a, 1.0 / s); }

Tensor rsub(const Tensor& a, double s) {
  if (cpu_half_inputs({a})) return rsub(half_to_f32(a), s).to(a.dtype());
  Tensor out = scalar_forward(BinaryOp::sub, a, s, true);
  return autograd::record(out, "RsubBackward", {a},
                          [](const Tensor& g) { return std::vector<Tensor>{neg(g)}; });
}

Tensor rdiv(const Tensor& a, double s) {
  if (cpu_half_inputs({a})) return rdiv(half_to_f32(a), s).to(a.dtype());
  Tensor out = scalar_forward(BinaryOp::div, a, s, true);
  // d(s/a)/da = -s / a^2 = -out / a
  return autograd::record(out, "RdivBackward", {a},
                          [sa = SavedTensor(a), so = SavedTensor(out)](const Tensor& g) {
                            return std::vector<Tensor>{neg(div(mul(g, so.get()), sa.get()))};
                          });
}

Tensor& add_(Tensor& a, const Tensor& b, double alpha) {
  if (b.defined() && a.defined() && b.shape() == a.shape() &&
      b.memory_format() != a.memory_format()) {
    const NoGradGuard no_grad;
    return add_(a, b.detach().contiguous(a.memory_format()), alpha);
  }
  check_inputs("add_", {a, b}, Formats::alike);
  RG_CHECK(a.shape() == b.shape(), "add_: shapes ", shape_str(a.shape()), " and ",
           shape_str(b.shape()), " differ");
  RG_CHECK(!autograd::needs_grad({a}),
           "add_: in-place update of a tensor that requires grad; wrap it in NoGradGuard");
  if (cpu_half_inputs({a, b})) {  // CPU f16/bf16: in f32, rounded back into a
    Tensor a32 = a.to(DType::f32);
    add_(a32, b.to(DType::f32), alpha);
    a.copy_(a32);
    return a;
  }
  dispatch_on(a.device(), a.dtype(), "add_", [&]<class T, class B>() {
    kernels::Binary<B>::axpy(alpha, b.data<T>(), a.data<T>(), a.numel(), kernel_ctx(a));
  });
  a.bump_version();
  return a;
}

Tensor& mul_(Tensor& a, double s) {
  check_inputs("mul_", {a}, Formats::alike);
  RG_CHECK(!autograd::needs_grad({a}),
           "mul_: in-place update of a tensor that requires grad; wrap it in NoGradGuard");
  if (cpu_half_inputs({a})) {  // CPU f16/bf16: in f32, rounded back into a
    Tensor a32 = a.to(DType::f32);
    mul_(a32, s);
    a.copy_(a32);
    return a;
  }
  dispatch_on(a.device(), a.dtype(), "mul_", [&]<class T, class B>() {
    kernels::Binary<B>::binary_scalar(BinaryOp::mul, a.data<T>(), s, a.data<T>(), a.numel(), false,
                                      kernel_ctx(a));
  });
  a.bump_version();
  return a;
}

}  // namespace rg
