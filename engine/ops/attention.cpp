// causal_attention forward and backward through kernels/attention.h's kernels on both devices.
// The forward's per-row log-sum-exp (f64 for f64 inputs, f32 otherwise) and its output are kept
// for the backward, with the dropout mask's (seed, offset), from which the backward regenerates it.
#include "engine/ops/attention.h"

#include <cmath>
#include <vector>

#include "engine/autocast.h"
#include "engine/autograd/function.h"
#include "engine/cuda/graph.h"
#include "engine/dispatch.h"
#include "engine/ops/autocast_policy.h"
#include "engine/ops/check.h"
#include "kernels/attention.h"
#include "kernels/error.h"

namespace rg {

using autograd::SavedTensor;

namespace {

DType acc_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                        double dropout_p, Generator* gen) {
  const char* op = "causal_attention";
  RG_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, op, ": dropout_p must be in [0, 1), got ",
           dropout_p);
  if (auto c = autocast_inputs(AutocastPolicy::lower, {q, k, v}))
    return causal_attention((*c)[0], (*c)[1], (*c)[2], scale, dropout_p, gen);
  check_inputs(op, {q, k, v});
  RG_CHECK(q.dim() == 4, op, ": expected q, k, v of shape [B, H, T, Dh], got q of shape ",
           shape_str(q.shape()));
  RG_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), op,
           ": q, k and v must have one shape, got ", shape_str(q.shape()), ", ",
           shape_str(k.shape()), " and ", shape_str(v.shape()));
  if (cpu_half_inputs({q, k, v})) {
    const NoAutocastGuard f32_route;  // (it would cast the f32 copies back)
    return causal_attention(half_to_f32(q), half_to_f32(k), half_to_f32(v), scale, dropout_p, gen)
        .to(q.dtype());
  }
  const int64_t bh = q.size(0) * q.size(1), t = q.size(2), d = q.size(3);
  const double sc = scale > 0 ? scale : 1.0 / std::sqrt(double(d));
  const double p = dropout_p;
  uint64_t seed = 0;
  philox::Offset offset;
  if (p > 0) {
    Generator& g = gen ? *gen : default_generator();
    seed = g.seed();
    offset = cuda::philox_offset(g, kernels::attention_dropout_groups(bh, t), q.device());
  }

  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  const Tensor lse = Tensor::empty({bh * t}, acc_dtype(q.dtype()), q.device());
  const bool empty = out.numel() == 0;
  if (!empty) {
    dispatch_on(q.device(), q.dtype(), op, [&]<class T, class B>() {
      kernels::CausalAttention<B>::forward(q.data<T>(), k.data<T>(), v.data<T>(), bh, t, d, sc, p,
                                           seed, offset, out.data<T>(),
                                           lse.data<kernels::AttentionAcc<T>>(), kernel_ctx(q));
    });
  }
  return autograd::record(
      out, "CausalAttentionBackward", {q, k, v},
      [sq = SavedTensor(q), sk = SavedTensor(k), sv = SavedTensor(v), so = SavedTensor(out), lse,
       bh, t, d, sc, p, seed, offset, empty](const Tensor& grad) -> std::vector<Tensor> {
        const Tensor qv = sq.get(), kv = sk.get(), vv = sv.get(), ov = so.get();
        Tensor gq = Tensor::empty(qv.shape(), grad.dtype(), grad.device());
        Tensor gk = Tensor::empty(qv.shape(), grad.dtype(), grad.device());
        Tensor gv = Tensor::empty(qv.shape(), grad.dtype(), grad.device());
        if (empty) return {gq, gk, gv};
        const Tensor& g = grad;
        dispatch_on(g.device(), g.dtype(), "causal_attention backward", [&]<class T, class B>() {
          using K = kernels::CausalAttention<B>;
          const Tensor ws =
              Tensor::empty({K::backward_workspace_bytes(bh, t)}, DType::u8, g.device());
          K::template backward<T>(g.data<T>(), qv.data<T>(), kv.data<T>(), vv.data<T>(),
                                  ov.data<T>(), lse.data<kernels::AttentionAcc<T>>(), bh, t, d, sc,
                                  p, seed, offset, gq.data<T>(), gk.data<T>(), gv.data<T>(),
                                  kernels::Workspace{ws.raw_data(), ws.numel()}, kernel_ctx(g));
        });
        return {gq, gk, gv};
      });
}

}  // namespace rg
