// conv2d forward and backward through kernels/conv2d.h's Conv2d<B> on either device (im2col +
// GEMM on the CPU, cuDNN on CUDA; the bias inside the kernels on both). The backward is one kernel
// call that produces only the gradients the inputs need.
#include "engine/ops/conv2d.h"

#include "engine/autocast.h"
#include "engine/autograd/function.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/check.h"
#include "engine/tf32.h"
#include "kernels/conv2d.h"
#include "kernels/error.h"

namespace rg {

using autograd::SavedTensor;
using kernels::Conv2dGeometry;

namespace {

std::string pair_str(std::array<int64_t, 2> p) { return detail::cat("(", p[0], ", ", p[1], ")"); }

Conv2dGeometry conv2d_geometry(const Tensor& x, const Tensor& weight, const Tensor& bias,
                               std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                               std::array<int64_t, 2> dilation) {
  const char* op = "conv2d";
  // Either format for x and weight (conv2d brings them to one); the bias is 1-d.
  if (bias.defined()) {
    check_inputs(op, {x, weight, bias}, Formats::any);
  } else {
    check_inputs(op, {x, weight}, Formats::any);
  }
  check_dim(op, x, 4, "input: N, C, H, W");
  check_dim(op, weight, 4, "weight: O, C, kh, kw");
  const Shape& xs = x.shape();
  const Shape& ws = weight.shape();
  RG_CHECK(ws[0] > 0 && ws[1] > 0 && ws[2] > 0 && ws[3] > 0, op, ": weight ", shape_str(ws),
           " has an empty dimension");
  RG_CHECK(xs[1] == ws[1], op, ": input ", shape_str(xs), " has ", xs[1], " channels but weight ",
           shape_str(ws), " expects ", ws[1]);
  if (bias.defined()) {
    RG_CHECK(bias.dim() == 1 && bias.size(0) == ws[0], op, ": bias ", shape_str(bias.shape()),
             " does not match the ", ws[0], " output channels of weight ", shape_str(ws));
  }
  RG_CHECK(stride[0] > 0 && stride[1] > 0, op, ": stride ", pair_str(stride), " must be positive");
  RG_CHECK(dilation[0] > 0 && dilation[1] > 0, op, ": dilation ", pair_str(dilation),
           " must be positive");
  RG_CHECK(padding[0] >= 0 && padding[1] >= 0, op, ": padding ", pair_str(padding),
           " must be non-negative");
  const int64_t extent_h = dilation[0] * (ws[2] - 1) + 1;
  const int64_t extent_w = dilation[1] * (ws[3] - 1) + 1;
  const int64_t padded_h = xs[2] + 2 * padding[0], padded_w = xs[3] + 2 * padding[1];
  RG_CHECK(extent_h <= padded_h && extent_w <= padded_w, op, ": kernel extent (", extent_h, ", ",
           extent_w, ") of weight ", shape_str(ws), " with dilation ", pair_str(dilation),
           " is larger than the padded input (", padded_h, ", ", padded_w, ") of input ",
           shape_str(xs));
  Conv2dGeometry g{};
  g.n = xs[0], g.c = xs[1], g.h = xs[2], g.w = xs[3];
  g.o = ws[0], g.kh = ws[2], g.kw = ws[3];
  g.sh = stride[0], g.sw = stride[1], g.ph = padding[0], g.pw = padding[1];
  g.dh = dilation[0], g.dw = dilation[1];
  g.ho = (padded_h - extent_h) / g.sh + 1;
  g.wo = (padded_w - extent_w) / g.sw + 1;
  return g;
}

// A u8 scratch tensor on t's device for `pass` of geometry g (on CUDA cuDNN's algorithm choice,
// cached; empty on the CPU).
template <class T, class B>
Tensor conv_workspace(const Conv2dGeometry& g, kernels::ConvPass pass, const Tensor& t) {
  return Tensor::empty({kernels::Conv2d<B>::template workspace_bytes<T>(
                           g, pass, cuda::allow_tf32_conv(), kernel_ctx(t))},
                       DType::u8, t.device());
}

kernels::Workspace as_workspace(const Tensor& ws) { return {ws.raw_data(), ws.numel()}; }

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
              std::array<int64_t, 2> dilation) {
  if (auto c = autocast_inputs(AutocastPolicy::lower, {x, weight, bias}))
    return conv2d((*c)[0], (*c)[1], (*c)[2], stride, padding, dilation);
  Conv2dGeometry g = conv2d_geometry(x, weight, bias, stride, padding, dilation);
  // Channels last when x or the weight is (PyTorch's suggested format): both in it, as cuDNN's
  // NHWC convolutions take them, and the output too. A mixed pair costs a layout conversion.
  constexpr MemoryFormat kLast = MemoryFormat::channels_last;
  g.channels_last = x.memory_format() == kLast || weight.memory_format() == kLast;
  if (g.channels_last && (x.memory_format() != kLast || weight.memory_format() != kLast))
    return conv2d(x.contiguous(kLast), weight.contiguous(kLast), bias, stride, padding, dilation);
  // cuDNN has no f64 convolution of NHWC tensors (PyTorch keeps f64 convolutions contiguous on
  // CUDA): those run contiguous, their output given back channels last.
  if (g.channels_last && x.dtype() == DType::f64 && x.device().is_cuda()) {
    return conv2d(x.contiguous(), weight.contiguous(), bias, stride, padding, dilation)
        .contiguous(kLast);
  }
  if (cpu_half_inputs({x, weight, bias})) {  // f32 accumulation over the half-rounded inputs
    const NoAutocastGuard f32_route;         // (it would cast the f32 copies back)
    return conv2d(half_to_f32(x), half_to_f32(weight), half_to_f32(bias), stride, padding, dilation)
        .to(x.dtype());
  }
  const MemoryFormat format = x.memory_format();
  Tensor out = Tensor::empty({g.n, g.o, g.ho, g.wo}, x.dtype(), x.device(), format);
  dispatch_on(x.device(), x.dtype(), "conv2d", [&]<class T, class B>() {
    const Tensor ws = conv_workspace<T, B>(g, kernels::ConvPass::forward, x);
    kernels::Conv2d<B>::forward(g, x.data<T>(), weight.data<T>(),
                                bias.defined() ? bias.data<T>() : nullptr, out.data<T>(),
                                cuda::allow_tf32_conv(), as_workspace(ws), kernel_ctx(x));
  });
  const bool gx = autograd::needs_grad({x}), gw = autograd::needs_grad({weight});
  const bool gb = autograd::needs_grad({bias});
  // x is needed only for the weight gradient, weight only for the input gradient.
  return autograd::record(
      out, "Conv2dBackward", {x, weight, bias},
      [g, gx, gw, gb, sx = SavedTensor(gw ? x : Tensor()), sw = SavedTensor(gx ? weight : Tensor()),
       wshape = weight.shape(), format](const Tensor& grad) -> std::vector<Tensor> {
        const Tensor xv = sx.get(), wv = sw.get();
        // grad is in the output's format (the engine's contract, Node::input_formats).
        Tensor dx = gx ? Tensor::empty({g.n, g.c, g.h, g.w}, grad.dtype(), grad.device(), format)
                       : Tensor();
        Tensor dw = gw ? Tensor::empty(wshape, grad.dtype(), grad.device(), format) : Tensor();
        Tensor db = gb ? Tensor::empty({g.o}, grad.dtype(), grad.device()) : Tensor();
        dispatch_on(grad.device(), grad.dtype(), "conv2d backward", [&]<class T, class B>() {
          const Tensor ws = gx || gw ? conv_workspace<T, B>(g, kernels::ConvPass::backward, grad)
                                     : Tensor::empty({0}, DType::u8, grad.device());
          kernels::Conv2d<B>::backward(g, gw ? xv.data<T>() : nullptr, gx ? wv.data<T>() : nullptr,
                                       grad.data<T>(), gx ? dx.data<T>() : nullptr,
                                       gw ? dw.data<T>() : nullptr, gb ? db.data<T>() : nullptr,
                                       cuda::allow_tf32_conv(), as_workspace(ws), kernel_ctx(grad));
        });
        return {dx, dw, db};
      });
}

}  // namespace rg
