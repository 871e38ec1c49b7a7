// matmul and linear on kernels/gemm.h's Gemm<B>: transposes are GEMM flags, never copies, and every
// backward product is one more GEMM (batched ones loop over the batch, summing where broadcast).
#include "engine/ops/matmul.h"

#include <algorithm>

#include "engine/autocast.h"
#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/check.h"
#include "engine/tf32.h"
#include "kernels/binary.h"
#include "kernels/error.h"
#include "kernels/gemm.h"
#include "kernels/reduce.h"

namespace rg {

using autograd::SavedTensor;

namespace {

// Where the GEMMs of one op run: the CPU (OpenBLAS), or the current stream of a CUDA device
// (cuBLAS) with a workspace from the caching allocator, freed in stream order after the op.
struct GemmDevice {
  kernels::Ctx ctx;
  Tensor workspace;

  explicit GemmDevice(const Tensor& like) : ctx(kernel_ctx(like)) {
    const int64_t bytes = like.device().is_cuda()
                              ? kernels::Gemm<kernels::Cuda>::workspace_bytes(ctx)
                              : kernels::Gemm<kernels::Cpu>::workspace_bytes(ctx);
    workspace = Tensor::empty({bytes}, DType::u8, like.device());
  }
  kernels::Workspace scratch() const { return {workspace.raw_data(), workspace.numel()}; }
};

// c (m x n) = op(a) op(b), or += when accumulate, for densely stored row-major matrices.
template <class T, class B>
void gemm_dense(const GemmDevice& dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                const T* a, const T* b, T* c, bool accumulate) {
  kernels::Gemm<B>::gemm(ta, tb, m, n, k, 1.0, a, ta ? m : k, b, tb ? k : n, accumulate ? 1.0 : 0.0,
                         c, n, cuda::allow_tf32_matmul(), dev.scratch(), dev.ctx);
}

// c_i = op(a_i) op(b_i) for i < batch, matrices `s*` elements apart. A stride of 0 for a or b
// reuses one matrix for the whole batch; a stride of 0 for c sums all products into one matrix
// (the backward of that reuse).
template <class T, class B>
void batched_gemm(const GemmDevice& dev, bool ta, bool tb, int64_t batch, int64_t m, int64_t n,
                  int64_t k, const T* a, int64_t sa, const T* b, int64_t sb, T* c, int64_t sc) {
  if (batch == 0 && sc == 0) gemm_dense<T, B>(dev, ta, tb, m, n, 0, a, b, c, false);  // c = 0
  for (int64_t i = 0; i < batch; ++i) {
    gemm_dense<T, B>(dev, ta, tb, m, n, k, a + i * sa, b + i * sb, c + i * sc, sc == 0 && i > 0);
  }
}

// [m,k]x[k,n], [b,m,k]x[b,k,n] and [m,k]x[b,k,n]; shapes were checked by matmul().
Tensor batched_matmul(const Tensor& a, const Tensor& b) {
  const bool a_batched = a.dim() == 3, b_batched = b.dim() == 3;
  const int64_t batch = a_batched ? a.size(0) : b_batched ? b.size(0) : 1;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const int64_t sa = a_batched ? m * k : 0, sb = b_batched ? k * n : 0;
  Tensor out = Tensor::empty(a_batched || b_batched ? Shape{batch, m, n} : Shape{m, n}, a.dtype(),
                             a.device());
  const GemmDevice dev(a);
  dispatch_on(a.device(), a.dtype(), "matmul", [&]<class T, class B>() {
    batched_gemm<T, B>(dev, false, false, batch, m, n, k, a.data<T>(), sa, b.data<T>(), sb,
                       out.data<T>(), m * n);
  });
  const bool ga = autograd::needs_grad({a}), gb = autograd::needs_grad({b});
  return autograd::record(
      out, "MatmulBackward", {a, b},
      [saved_a = SavedTensor(gb ? a : Tensor()), saved_b = SavedTensor(ga ? b : Tensor()),
       shape_a = a.shape(), shape_b = b.shape(), ga, gb, batch, m, n, k, sa, sb](const Tensor& g) {
        Tensor grad_a, grad_b;
        const GemmDevice dev(g);
        dispatch_on(g.device(), g.dtype(), "matmul_backward", [&]<class T, class B>() {
          if (ga) {  // dA_i = dC_i B_i^T
            grad_a = Tensor::empty(shape_a, g.dtype(), g.device());
            batched_gemm<T, B>(dev, false, true, batch, m, k, n, g.data<T>(), m * n,
                               saved_b.get().data<T>(), sb, grad_a.data<T>(), sa);
          }
          if (gb) {  // dB_i = A_i^T dC_i
            grad_b = Tensor::empty(shape_b, g.dtype(), g.device());
            batched_gemm<T, B>(dev, true, false, batch, k, n, m, saved_a.get().data<T>(), sa,
                               g.data<T>(), m * n, grad_b.data<T>(), sb);
          }
        });
        return std::vector<Tensor>{grad_a, grad_b};
      });
}

// `s` without dimension `d` (the size-1 dimension a 1-D operand was promoted with).
Shape drop_dim(Shape s, int64_t d) {
  s.erase(s.begin() + (d < 0 ? int64_t(s.size()) + d : d));
  return s;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (auto c = autocast_inputs(AutocastPolicy::lower, {a, b})) return matmul((*c)[0], (*c)[1]);
  check_inputs("matmul", {a, b});
  if (cpu_half_inputs({a, b})) {
    const NoAutocastGuard f32_route;  // (it would cast the f32 copies back)
    return matmul(half_to_f32(a), half_to_f32(b)).to(a.dtype());
  }
  const int64_t da = a.dim(), db = b.dim();
  RG_CHECK(da >= 1 && da <= 3 && db >= 1 && db <= 3,
           "matmul: expected 1-d, 2-d or 3-d operands, got shapes ", shape_str(a.shape()), " and ",
           shape_str(b.shape()));
  const int64_t ka = a.size(-1), kb = db == 1 ? b.size(0) : b.size(-2);
  RG_CHECK(ka == kb, "matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
           " cannot be multiplied (", ka, " != ", kb, ")");
  RG_CHECK(da != 3 || db != 3 || a.size(0) == b.size(0), "matmul: batch sizes differ in shapes ",
           shape_str(a.shape()), " and ", shape_str(b.shape()));
  // 1-D operands become a row (a) or a column (b) matrix whose extra dimension is then dropped;
  // view() is differentiable, so the backward needs nothing extra.
  if (da == 1 && db == 1) return matmul(a.view({1, ka}), b.view({kb, 1})).view({});
  if (da == 1) {
    const Tensor out = matmul(a.view({1, ka}), b);
    return out.view(drop_dim(out.shape(), -2));
  }
  if (db == 1) {
    const Tensor out = matmul(a, b.view({kb, 1}));
    return out.view(drop_dim(out.shape(), -1));
  }
  // [b,m,k]x[k,n] is one [b*m,k]x[k,n] GEMM, in the forward and in both backward products.
  if (da == 3 && db == 2) {
    const Tensor out = batched_matmul(a.view({a.size(0) * a.size(1), ka}), b);
    return out.view({a.size(0), a.size(1), b.size(1)});
  }
  return batched_matmul(a, b);
}

void matmul_out(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out) {
  check_inputs("matmul_out", {a, b, out});
  check_dim("matmul_out", a, 2, "[m, k] (or [k, m] transposed)");
  check_dim("matmul_out", b, 2, "[k, n] (or [n, k] transposed)");
  check_dim("matmul_out", out, 2, "[m, n]");
  const int64_t m = a.size(trans_a ? 1 : 0), k = a.size(trans_a ? 0 : 1);
  const int64_t kb = b.size(trans_b ? 1 : 0), n = b.size(trans_b ? 0 : 1);
  RG_CHECK(k == kb && out.size(0) == m && out.size(1) == n, "matmul_out: shapes ",
           shape_str(a.shape()), trans_a ? "^T" : "", " x ", shape_str(b.shape()),
           trans_b ? "^T" : "", " -> ", shape_str(out.shape()), " do not fit");
  RG_CHECK(!(GradMode::is_enabled() && out.requires_grad()),
           "matmul_out: writes into a tensor that requires grad");
  const GemmDevice dev(a);
  dispatch_on(a.device(), a.dtype(), "matmul_out", [&]<class T, class B>() {
    gemm_dense<T, B>(dev, trans_a, trans_b, m, n, k, a.data<T>(), b.data<T>(), out.data<T>(),
                     false);
  });
  out.bump_version();
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (auto c = autocast_inputs(AutocastPolicy::lower, {x, weight, bias}))
    return linear((*c)[0], (*c)[1], (*c)[2]);
  const bool has_bias = bias.defined();
  if (has_bias) {
    check_inputs("linear", {x, weight, bias});
  } else {
    check_inputs("linear", {x, weight});
  }
  check_dim("linear", weight, 2, "weight [out_features, in_features]");
  RG_CHECK(x.dim() >= 1, "linear: input must have at least one dimension, got shape ",
           shape_str(x.shape()));
  const int64_t in = weight.size(1), out_f = weight.size(0);
  RG_CHECK(x.size(-1) == in, "linear: input shape ", shape_str(x.shape()), " has ", x.size(-1),
           " features but weight ", shape_str(weight.shape()), " expects ", in);
  RG_CHECK(!has_bias || (bias.dim() == 1 && bias.size(0) == out_f), "linear: bias shape ",
           shape_str(has_bias ? bias.shape() : Shape{}), " does not match weight ",
           shape_str(weight.shape()), " (expected [", out_f, "])");
  if (cpu_half_inputs({x, weight, bias})) {  // f32 accumulation over the half-rounded inputs
    const NoAutocastGuard f32_route;         // (it would cast the f32 copies back)
    return linear(half_to_f32(x), half_to_f32(weight), half_to_f32(bias)).to(x.dtype());
  }
  int64_t lead = 1;  // rows of the GEMM: the product of x's leading dimensions
  for (int64_t d = 0; d + 1 < x.dim(); ++d) lead *= x.size(d);
  Shape out_shape = x.shape();
  out_shape.back() = out_f;
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  const GemmDevice dev(x);
  dispatch_on(x.device(), x.dtype(), "linear", [&]<class T, class B>() {
    // x W^T, then the bias added to every row in place, the same way on both devices.
    T* yp = y.data<T>();
    gemm_dense<T, B>(dev, false, true, lead, out_f, in, x.data<T>(), weight.data<T>(), yp, false);
    if (has_bias) {
      kernels::Binary<B>::binary_per_channel(kernels::BinaryOp::add, yp, bias.data<T>(), yp, lead,
                                             out_f, 1, false, dev.ctx);
    }
  });
  const bool gx = autograd::needs_grad({x}), gw = autograd::needs_grad({weight});
  const bool gb = has_bias && autograd::needs_grad({bias});
  return autograd::record(
      y, "LinearBackward", {x, weight, bias},
      [saved_x = SavedTensor(gw ? x : Tensor()), saved_w = SavedTensor(gx ? weight : Tensor()),
       shape_x = x.shape(), shape_w = weight.shape(), gx, gw, gb, lead, in,
       out_f](const Tensor& g) {
        Tensor grad_x, grad_w, grad_b;
        const GemmDevice dev(g);
        dispatch_on(g.device(), g.dtype(), "linear_backward", [&]<class T, class B>() {
          if (gx) {  // dX = dY W
            grad_x = Tensor::empty(shape_x, g.dtype(), g.device());
            gemm_dense<T, B>(dev, false, false, lead, in, out_f, g.data<T>(),
                             saved_w.get().data<T>(), grad_x.data<T>(), false);
          }
          if (gw) {  // dW = dY^T X
            grad_w = Tensor::empty(shape_w, g.dtype(), g.device());
            gemm_dense<T, B>(dev, true, false, out_f, in, lead, g.data<T>(),
                             saved_x.get().data<T>(), grad_w.data<T>(), false);
          }
          if (gb) {  // db = sum of dY over rows
            grad_b = Tensor::empty({out_f}, g.dtype(), g.device());
            kernels::Reduce<B>::sum_dim(g.data<T>(), grad_b.data<T>(), 1, lead, out_f, dev.ctx);
          }
        });
        return std::vector<Tensor>{grad_x, grad_w, grad_b};
      });
}

}  // namespace rg
