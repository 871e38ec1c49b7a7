// max_pool2d / avg_pool2d / adaptive_avg_pool2d through kernels/pool.h, one call per kernel on
// both devices, in either memory format (the kernels index channels last themselves); average
// pooling through cuDNN (kernels/cuda/pool_cudnn.h) where engine/ops/cudnn.h allows. Max pooling
// keeps the argmax of every window (i64) for its backward and never uses cuDNN, whose backward does
// not promise the first of equal maxima. adaptive_avg_pool2d to 1x1 has its own reduction kernel
// (one block per plane on CUDA), as PyTorch reduces with its own kernel there too.
#include "engine/ops/pool.h"

#include <type_traits>

#include "engine/autograd/function.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/check.h"
#include "engine/ops/cudnn.h"
#include "kernels/cuda/pool_cudnn.h"
#include "kernels/error.h"
#include "kernels/pool.h"

namespace rg {

using kernels::Pool2dGeometry;

namespace {

std::string pair_str(std::array<int64_t, 2> p) { return detail::cat("(", p[0], ", ", p[1], ")"); }

Pool2dGeometry pool_geometry(const char* op, const Tensor& x, std::array<int64_t, 2> kernel,
                             std::array<int64_t, 2> stride, std::array<int64_t, 2> padding) {
  check_inputs(op, {x}, Formats::any);
  check_dim(op, x, 4, "N, C, H, W");
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;
  RG_CHECK(kernel[0] > 0 && kernel[1] > 0, op, ": kernel ", pair_str(kernel), " must be positive");
  RG_CHECK(stride[0] > 0 && stride[1] > 0, op, ": stride ", pair_str(stride), " must be positive");
  RG_CHECK(padding[0] >= 0 && padding[1] >= 0 && 2 * padding[0] <= kernel[0] &&
               2 * padding[1] <= kernel[1],
           op, ": padding ", pair_str(padding), " must be between 0 and half the kernel ",
           pair_str(kernel));
  const Shape& s = x.shape();
  const int64_t padded_h = s[2] + 2 * padding[0], padded_w = s[3] + 2 * padding[1];
  RG_CHECK(kernel[0] <= padded_h && kernel[1] <= padded_w, op, ": kernel ", pair_str(kernel),
           " is larger than the padded input (", padded_h, ", ", padded_w, ") of input ",
           shape_str(s));
  return Pool2dGeometry{s[0] * s[1],
                        s[2],
                        s[3],
                        kernel[0],
                        kernel[1],
                        stride[0],
                        stride[1],
                        padding[0],
                        padding[1],
                        (padded_h - kernel[0]) / stride[0] + 1,
                        (padded_w - kernel[1]) / stride[1] + 1,
                        s[1],
                        x.memory_format() == MemoryFormat::channels_last};
}

// The pooled output of x (in x's memory format), or its argmax with `dtype`.
Tensor pool_output(const Tensor& x, const Pool2dGeometry& g, DType dtype) {
  return Tensor::empty({x.size(0), x.size(1), g.ho, g.wo}, dtype, x.device(), x.memory_format());
}

// Whether average pooling of x goes through cuDNN: the switch is on, x is on CUDA in f32, f64 or
// f16 (bf16 stays on our kernels, as for batch norm), contiguous (channels last runs on ours) and
// cuDNN takes the geometry.
bool use_cudnn(const Tensor& x, const Pool2dGeometry& g) {
  return x.device().is_cuda() && cudnn_enabled() && x.dtype() != DType::bf16 && !g.channels_last &&
         kernels::cuda::cudnn_pool2d_supported(g);
}

template <class T>
constexpr bool kCudnnType = !std::is_same_v<T, BFloat16>;

// Average pooling through cuDNN (use_cudnn said yes). cuDNN's backward also takes x and y, kept
// only for it: detached (y's history would hold this node) and without SavedTensor's in-place
// checks, since an average's gradient does not read their values (our kernels keep neither and
// must not fail where this path passes).
Tensor avg_pool_cudnn(const char* op, const Tensor& x, const Pool2dGeometry& g,
                      bool count_include_pad) {
  Tensor out = Tensor::empty({x.size(0), x.size(1), g.ho, g.wo}, x.dtype(), x.device());
  dispatch_on(x.device(), x.dtype(), op, [&]<class T, class B>() {
    if constexpr (kOnCuda<B> && kCudnnType<T>) {
      kernels::cuda::cudnn_avg_pool2d_forward<T>(g, x.data<T>(), out.data<T>(), count_include_pad,
                                                 cuda_stream(x));
    }
  });
  return autograd::record(
      out, "AvgPool2dBackward", {x},
      [g, count_include_pad, shape = x.shape(), xs = x.detach(),
       ys = out.detach()](const Tensor& grad) {
        Tensor dx = Tensor::empty(shape, grad.dtype(), grad.device());
        dispatch_cuda_float(grad.dtype(), "avg_pool2d backward", [&]<class T>() {
          if constexpr (kCudnnType<T>) {
            kernels::cuda::cudnn_avg_pool2d_backward<T>(g, xs.data<T>(), ys.data<T>(),
                                                        grad.data<T>(), dx.data<T>(),
                                                        count_include_pad, cuda_stream(grad));
          }
        });
        return std::vector<Tensor>{dx};
      });
}

Tensor avg_pool(const char* op, const Tensor& x, const Pool2dGeometry& g, bool count_include_pad) {
  if (use_cudnn(x, g)) return avg_pool_cudnn(op, x, g, count_include_pad);
  Tensor out = pool_output(x, g, x.dtype());
  dispatch_on(x.device(), x.dtype(), op, [&]<class T, class B>() {
    kernels::Pool<B>::avg_pool2d(g, x.data<T>(), out.data<T>(), count_include_pad, kernel_ctx(x));
  });
  return autograd::record(
      out, "AvgPool2dBackward", {x},
      [g, count_include_pad, shape = x.shape(), format = x.memory_format()](const Tensor& grad) {
        Tensor dx = Tensor::empty(shape, grad.dtype(), grad.device(), format);
        dispatch_on(grad.device(), grad.dtype(), "avg_pool2d backward", [&]<class T, class B>() {
          kernels::Pool<B>::avg_pool2d_backward(g, grad.data<T>(), dx.data<T>(), count_include_pad,
                                                kernel_ctx(grad));
        });
        return std::vector<Tensor>{dx};
      });
}

}  // namespace

Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  if (cpu_half_inputs({x}))
    return max_pool2d(half_to_f32(x), kernel, stride, padding).to(x.dtype());
  const Pool2dGeometry g = pool_geometry("max_pool2d", x, kernel, stride, padding);
  Tensor out = pool_output(x, g, x.dtype());
  // The argmax is internal to this op (nobody can modify it), so it needs no SavedTensor.
  Tensor argmax = pool_output(x, g, DType::i64);
  dispatch_on(x.device(), x.dtype(), "max_pool2d", [&]<class T, class B>() {
    kernels::Pool<B>::max_pool2d(g, x.data<T>(), out.data<T>(), argmax.data<int64_t>(),
                                 kernel_ctx(x));
  });
  return autograd::record(
      out, "MaxPool2dBackward", {x},
      [g, argmax, shape = x.shape(), format = x.memory_format()](const Tensor& grad) {
        Tensor dx = Tensor::empty(shape, grad.dtype(), grad.device(), format);
        dispatch_on(grad.device(), grad.dtype(), "max_pool2d backward", [&]<class T, class B>() {
          kernels::Pool<B>::max_pool2d_backward(g, grad.data<T>(), argmax.data<int64_t>(),
                                                dx.data<T>(), kernel_ctx(grad));
        });
        return std::vector<Tensor>{dx};
      });
}

Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding, bool count_include_pad) {
  if (cpu_half_inputs({x}))
    return avg_pool2d(half_to_f32(x), kernel, stride, padding, count_include_pad).to(x.dtype());
  const Pool2dGeometry g = pool_geometry("avg_pool2d", x, kernel, stride, padding);
  return avg_pool("avg_pool2d", x, g, count_include_pad);
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size) {
  if (cpu_half_inputs({x})) return adaptive_avg_pool2d(half_to_f32(x), output_size).to(x.dtype());
  const char* op = "adaptive_avg_pool2d";
  RG_CHECK(output_size[0] == 1 && output_size[1] == 1, op, ": output size ", pair_str(output_size),
           " is not implemented (only (1, 1), global average pooling)");
  check_inputs(op, {x}, Formats::any);
  check_dim(op, x, 4, "N, C, H, W");
  RG_CHECK(x.size(2) > 0 && x.size(3) > 0, op, ": input ", shape_str(x.shape()),
           " has an empty spatial dimension");
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  // A 1x1 output lies the same in both formats: it is contiguous either way, so that flatten
  // views it without a conversion.
  const bool last = x.memory_format() == MemoryFormat::channels_last;
  Tensor out = Tensor::empty({n, c, 1, 1}, x.dtype(), x.device());
  dispatch_on(x.device(), x.dtype(), op, [&]<class T, class B>() {
    if (last) {
      kernels::Pool<B>::adaptive_avg_pool2d_1x1_channels_last(x.data<T>(), out.data<T>(), n, c, hw,
                                                              kernel_ctx(x));
    } else {
      kernels::Pool<B>::adaptive_avg_pool2d_1x1(x.data<T>(), out.data<T>(), n * c, hw,
                                                kernel_ctx(x));
    }
  });
  return autograd::record(
      out, "AdaptiveAvgPool2dBackward", {x},
      [n, c, hw, last, shape = x.shape(), format = x.memory_format()](const Tensor& grad) {
        Tensor dx = Tensor::empty(shape, grad.dtype(), grad.device(), format);
        dispatch_on(grad.device(), grad.dtype(), "adaptive_avg_pool2d backward",
                    [&]<class T, class B>() {
                      if (last) {
                        kernels::Pool<B>::adaptive_avg_pool2d_1x1_channels_last_backward(
                            grad.data<T>(), dx.data<T>(), n, c, hw, kernel_ctx(grad));
                      } else {
                        kernels::Pool<B>::adaptive_avg_pool2d_1x1_backward(
                            grad.data<T>(), dx.data<T>(), n * c, hw, kernel_ctx(grad));
                      }
                    });
        return std::vector<Tensor>{dx};
      });
}

}  // namespace rg
