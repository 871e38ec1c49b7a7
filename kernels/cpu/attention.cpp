// The causal self-attention kernels on the CPU (kernels/attention.h): a reference path. The
// forward and the query gradient run (head, query row) pairs in parallel, the key and value
// gradients (head, key row) pairs, each recomputing its row of P from the saved log-sum-exp and
// summing in a fixed order.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {

// Rows per parallel task: enough work that a task outweighs its scheduling.
int64_t grain_for(int64_t per_row) {
  return per_row >= (1 << 12) ? 1 : (1 << 12) / (per_row + 1) + 1;
}

template <class A, class T>
A dot(const T* a, const T* b, int64_t d) {
  A s = 0;
  for (int64_t c = 0; c < d; ++c) s += A(a[c]) * A(b[c]);
  return s;
}

}  // namespace

template <>
template <class T>
void CausalAttention<Cpu>::forward(const T* q, const T* k, const T* v, int64_t bh, int64_t t,
                                   int64_t d, double scale, T* out, AttentionAcc<T>* lse, Ctx ctx) {
  using A = AttentionAcc<T>;
  detail::check_attention_sizes("causal_attention", bh, t, d, scale);
  const A sc = A(scale);
  cpu::parallel_for(
      0, bh * t, grain_for(t * (d + 1)),
      [&](int64_t lo, int64_t hi) {
        std::vector<A> p(static_cast<size_t>(t)), acc(static_cast<size_t>(d));
        for (int64_t row = lo; row < hi; ++row) {
          const int64_t r = row / t, i = row % t;
          const T* qi = q + row * d;
          const T* kr = k + r * t * d;
          const T* vr = v + r * t * d;
          A m = -std::numeric_limits<A>::infinity();
          for (int64_t j = 0; j <= i; ++j) {
            p[size_t(j)] = sc * dot<A>(qi, kr + j * d, d);
            m = std::max(m, p[size_t(j)]);
          }
          A sum = 0;
          for (int64_t j = 0; j <= i; ++j) {
            p[size_t(j)] = std::exp(p[size_t(j)] - m);
            sum += p[size_t(j)];
          }
          std::fill(acc.begin(), acc.end(), A(0));
          for (int64_t j = 0; j <= i; ++j) {
            const T* vj = vr + j * d;
            for (int64_t c = 0; c < d; ++c) acc[size_t(c)] += p[size_t(j)] * A(vj[c]);
          }
          T* o = out + row * d;
          for (int64_t c = 0; c < d; ++c) o[c] = T(acc[size_t(c)] / sum);
          lse[row] = m + std::log(sum);
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
                                    double scale, T* gq, T* gk, T* gv, Workspace, Ctx ctx) {
  using A = AttentionAcc<T>;
  detail::check_attention_sizes("causal_attention_backward", bh, t, d, scale);
  const A sc = A(scale);
  std::vector<A> delta(static_cast<size_t>(bh * t));
  cpu::parallel_for(
      0, bh * t, grain_for(d),
      [&](int64_t lo, int64_t hi) {
        for (int64_t row = lo; row < hi; ++row)
          delta[size_t(row)] = dot<A>(gout + row * d, out + row * d, d);
      },
      ctx.threads);
  // P_ij and dS_ij of head r.
  const auto p_ds = [&](int64_t r, int64_t i, int64_t j, A& p, A& ds) {
    const int64_t qi = (r * t + i) * d, kj = (r * t + j) * d;
    p = std::exp(sc * dot<A>(q + qi, k + kj, d) - lse[r * t + i]);
    ds = p * (dot<A>(gout + qi, v + kj, d) - delta[size_t(r * t + i)]);
  };
  // gq, by query row.
  cpu::parallel_for(
      0, bh * t, grain_for(t * (d + 1)),
      [&](int64_t lo, int64_t hi) {
        std::vector<A> acc(static_cast<size_t>(d));
        for (int64_t row = lo; row < hi; ++row) {
          const int64_t r = row / t, i = row % t;
          std::fill(acc.begin(), acc.end(), A(0));
          for (int64_t j = 0; j <= i; ++j) {
            A p, ds;
            p_ds(r, i, j, p, ds);
            const T* kj = k + (r * t + j) * d;
            for (int64_t c = 0; c < d; ++c) acc[size_t(c)] += ds * A(kj[c]);
          }
          for (int64_t c = 0; c < d; ++c) gq[row * d + c] = T(sc * acc[size_t(c)]);
        }
      },
      ctx.threads);
  // gk and gv, by key row.
  cpu::parallel_for(
      0, bh * t, grain_for(t * (d + 1)),
      [&](int64_t lo, int64_t hi) {
        std::vector<A> ak(static_cast<size_t>(d)), av(static_cast<size_t>(d));
        for (int64_t row = lo; row < hi; ++row) {
          const int64_t r = row / t, j = row % t;
          std::fill(ak.begin(), ak.end(), A(0));
          std::fill(av.begin(), av.end(), A(0));
          for (int64_t i = j; i < t; ++i) {
            A p, ds;
            p_ds(r, i, j, p, ds);
            const T* qi = q + (r * t + i) * d;
            const T* gi = gout + (r * t + i) * d;
            for (int64_t c = 0; c < d; ++c) {
              ak[size_t(c)] += ds * A(qi[c]);
              av[size_t(c)] += p * A(gi[c]);
            }
          }
          for (int64_t c = 0; c < d; ++c) {
            gk[row * d + c] = T(sc * ak[size_t(c)]);
            gv[row * d + c] = T(av[size_t(c)]);
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
