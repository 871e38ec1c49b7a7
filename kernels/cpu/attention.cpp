// The causal self-attention kernels on the CPU (kernels/attention.h). Heads run in parallel, one
// worker per head with single-threaded OpenBLAS, and each head goes through blocks of kRows query
// rows: the block's scores against the keys it may see (one GEMM, at most kRows x t of scratch),
// the causal softmax row by row (Eigen's vectorized exp), then GEMMs for the output or, in the
// backward, for dV, dP, dQ and dK (dK and dV accumulate over the blocks in block order). A head's
// arithmetic does not depend on the number of threads, so neither do the results. With dropout,
// each row's mask multipliers are drawn from Philox (kernels/attention.h's layout) right after
// its softmax, in the forward and again in the backward.
#include "kernels/attention.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dropout.h"
#include "kernels/philox.h"

namespace rg::kernels {
namespace {

constexpr int64_t kRows = 64;  // query rows per block: the scratch is 2 x kRows x t per worker

template <class T>
using Row = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;

// s = alpha * q[rows] k[0:n]^T: the scores of `rows` queries against the first n keys (all zero
// when d is 0, which BLAS need not handle).
template <class T>
void scores(const T* q, const T* k, int64_t rows, int64_t n, int64_t d, T alpha, T* s) {
  if (d == 0) {
    std::fill_n(s, rows * n, T(0));
    return;
  }
  cpu::gemm<T>(false, true, rows, n, d, alpha, q, d, k, d, T(0), s, n);
}

// The dropout mask of one query row, as multipliers (0 or 1 / (1 - p)).
template <class T>
struct RowMask {
  bool on;
  uint32_t threshold;
  T keep;
  uint64_t seed, offset;
  int64_t t;

  RowMask(double p, uint64_t seed_, uint64_t offset_, int64_t t_)
      : on(p > 0),
        threshold(detail::dropout_keep_threshold(p)),
        keep(on ? T(1.0 / (1.0 - p)) : T(1)),
        seed(seed_),
        offset(offset_),
        t(t_) {}

  // m[j] = M[r, i, j] for j < n.
  void draw(int64_t r, int64_t i, int64_t n, T* m) const {
    const uint64_t first = attention_dropout_group(offset, r, i, 0, t);
    for (int64_t g = 0; 4 * g < n; ++g) {
      const philox::U32x4 w = philox::block(seed, first + uint64_t(g));
      for (int64_t c = 0; c < 4 && 4 * g + c < n; ++c)
        m[4 * g + c] = (w.v[c] >> 8) >= threshold ? keep : T(0);
    }
  }
};

}  // namespace

template <>
template <class T>
void CausalAttention<Cpu>::forward(const T* q, const T* k, const T* v, int64_t bh, int64_t t,
                                   int64_t d, double scale, double dropout_p, uint64_t seed,
                                   philox::Offset offset, T* out, AttentionAcc<T>* lse, Ctx ctx) {
  detail::check_attention_sizes("causal_attention", bh, t, d, scale, dropout_p);
  if (bh == 0 || t == 0) return;
  const RowMask<T> mask(dropout_p, seed, philox::host_offset(offset, "causal_attention"), t);
  cpu::SingleThreadedBlas single;
  cpu::parallel_for(
      0, bh, 1,
      [&](int64_t lo, int64_t hi) {
        std::vector<T> s(static_cast<size_t>(std::min(kRows, t) * t));
        std::vector<T> mrow(mask.on ? static_cast<size_t>(t) : 0);
        for (int64_t r = lo; r < hi; ++r) {
          const T *qr = q + r * t * d, *kr = k + r * t * d, *vr = v + r * t * d;
          for (int64_t i0 = 0; i0 < t; i0 += kRows) {
            const int64_t rows = std::min(kRows, t - i0), n = i0 + rows;  // keys 0 .. n-1
            scores(qr + i0 * d, kr, rows, n, d, T(scale), s.data());
            for (int64_t ii = 0; ii < rows; ++ii) {
              T* row = s.data() + ii * n;
              const int64_t valid = i0 + ii + 1;  // keys j <= i
              Row<T> p(row, valid);
              const T m = p.maxCoeff();
              p = (p - m).exp();
              const T sum = p.sum();
              p *= T(1) / sum;
              std::fill(row + valid, row + n, T(0));
              lse[r * t + i0 + ii] = m + std::log(sum);
              if (mask.on) {
                mask.draw(r, i0 + ii, valid, mrow.data());
                p *= Row<T>(mrow.data(), valid);
              }
            }
            if (d > 0)
              cpu::gemm<T>(false, false, rows, d, n, T(1), s.data(), n, vr, d, T(0),
                           out + (r * t + i0) * d, d);
          }
        }
      },
      ctx.threads);
}

template <>
int64_t CausalAttention<Cpu>::backward_workspace_bytes(int64_t, int64_t) {
  return 0;
}

template <>
template <class T>
void CausalAttention<Cpu>::backward(const T* gout, const T* q, const T* k, const T* v, const T* out,
                                    const AttentionAcc<T>* lse, int64_t bh, int64_t t, int64_t d,
                                    double scale, double dropout_p, uint64_t seed,
                                    philox::Offset offset, T* gq, T* gk, T* gv, Workspace,
                                    Ctx ctx) {
  detail::check_attention_sizes("causal_attention_backward", bh, t, d, scale, dropout_p);
  if (bh == 0 || t == 0 || d == 0) return;  // d == 0: every gradient is empty
  const RowMask<T> mask(dropout_p, seed,
                        philox::host_offset(offset, "causal_attention_backward"), t);
  cpu::SingleThreadedBlas single;
  cpu::parallel_for(
      0, bh, 1,
      [&](int64_t lo, int64_t hi) {
        const size_t block = static_cast<size_t>(std::min(kRows, t) * t);
        std::vector<T> p(block), dp(block), delta(static_cast<size_t>(t));
        std::vector<T> mrow(mask.on ? static_cast<size_t>(t) : 0);
        for (int64_t r = lo; r < hi; ++r) {
          const int64_t off = r * t * d;
          const T *qr = q + off, *kr = k + off, *vr = v + off, *gr = gout + off;
          T *gqr = gq + off, *gkr = gk + off, *gvr = gv + off;
          std::fill_n(gkr, t * d, T(0));
          std::fill_n(gvr, t * d, T(0));
          for (int64_t i = 0; i < t; ++i) {  // delta_i = gout_i . out_i
            T acc = 0;
            for (int64_t c = 0; c < d; ++c) acc += gr[i * d + c] * out[off + i * d + c];
            delta[size_t(i)] = acc;
          }
          for (int64_t i0 = 0; i0 < t; i0 += kRows) {
            const int64_t rows = std::min(kRows, t - i0), n = i0 + rows;
            // P from the saved log-sum-exp, zero above the diagonal.
            scores(qr + i0 * d, kr, rows, n, d, T(scale), p.data());
            for (int64_t ii = 0; ii < rows; ++ii) {
              T* row = p.data() + ii * n;
              const int64_t valid = i0 + ii + 1;
              Row<T> pr(row, valid);
              pr = (pr - T(lse[r * t + i0 + ii])).exp();
              std::fill(row + valid, row + n, T(0));
            }
            const T* gb = gr + i0 * d;
            if (!mask.on) {
              // dV[0:n] += P^T gout_block;  dP = gout_block V[0:n]^T.
              cpu::gemm<T>(true, false, n, d, rows, T(1), p.data(), n, gb, d, T(1), gvr, d);
              cpu::gemm<T>(false, true, rows, n, d, T(1), gb, d, vr, d, T(0), dp.data(), n);
              // dS = P (dP - delta), in place of dP (zero where P is).
              for (int64_t ii = 0; ii < rows; ++ii) {
                Row<T> ds(dp.data() + ii * n, n);
                const Row<T> pr(p.data() + ii * n, n);
                ds = pr * (ds - delta[size_t(i0 + ii)]);
              }
            } else {
              // dP = gout_block V[0:n]^T;  dS = P (M dP - delta);  P becomes P M for
              // dV[0:n] += (P M)^T gout_block. (Past the diagonal P is zero and stays so.)
              cpu::gemm<T>(false, true, rows, n, d, T(1), gb, d, vr, d, T(0), dp.data(), n);
              for (int64_t ii = 0; ii < rows; ++ii) {
                const int64_t valid = i0 + ii + 1;
                mask.draw(r, i0 + ii, valid, mrow.data());
                const Row<T> mr(mrow.data(), valid);
                Row<T> ds(dp.data() + ii * n, valid), pr(p.data() + ii * n, valid);
                ds = pr * (mr * ds - delta[size_t(i0 + ii)]);
                pr *= mr;
                std::fill(dp.data() + ii * n + valid, dp.data() + (ii + 1) * n, T(0));
              }
              cpu::gemm<T>(true, false, n, d, rows, T(1), p.data(), n, gb, d, T(1), gvr, d);
            }
            // dQ_block = scale dS K[0:n];  dK[0:n] += scale dS^T Q_block.
            cpu::gemm<T>(false, false, rows, d, n, T(scale), dp.data(), n, kr, d, T(0),
                         gqr + i0 * d, d);
            cpu::gemm<T>(true, false, n, d, rows, T(scale), dp.data(), n, qr + i0 * d, d, T(1), gkr,
                         d);
          }
        }
      },
      ctx.threads);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_attention_kernels() {
  using K = CausalAttention<Cpu>;
  return std::tuple{&K::forward<T>, &K::backward<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_attention_kernels)

}  // namespace rg::kernels
