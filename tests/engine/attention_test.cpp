// causal_attention against a hand-checkable case, f64 loops of its formulas and the same
// attention composed from existing ops (the op table checks gradients, devices and dtypes).
#include "engine/ops/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/ops/matmul.h"
#include "engine/ops/reduce.h"
#include "support/errors.h"

namespace rg {
namespace {

using testing::expect_error;

// One head, T = 3, Dh = 2: row 0 attends only to key 0, row 1 to keys 0 and 1, row 2 to all.
const std::vector<double> kQ = {1, 0, 0, 1, 1, 1};
const std::vector<double> kK = {1, 2, 0, -1, 3, 1};
const std::vector<double> kV = {1, 0, 0, 1, 2, -1};

// out and, for the upstream gradient sum(out * w), the gradients of q, k and v, by the formulas of
// engine/ops/attention.h in f64 loops.
struct Reference {
  std::vector<double> out, gq, gk, gv;
};
Reference reference(int64_t t, int64_t d, const std::vector<double>& q,
                    const std::vector<double>& k, const std::vector<double>& v,
                    const std::vector<double>& w, double scale) {
  Reference r{std::vector<double>(size_t(t * d)), std::vector<double>(size_t(t * d)),
              std::vector<double>(size_t(t * d)), std::vector<double>(size_t(t * d))};
  const auto at = [d](const std::vector<double>& a, int64_t i, int64_t c) {
    return a[size_t(i * d + c)];
  };
  for (int64_t i = 0; i < t; ++i) {
    std::vector<double> p(size_t(i + 1));
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j <= i; ++j) {
      double s = 0;
      for (int64_t c = 0; c < d; ++c) s += at(q, i, c) * at(k, j, c);
      p[size_t(j)] = s * scale;
      m = std::max(m, p[size_t(j)]);
    }
    for (double& x : p) sum += (x = std::exp(x - m));
    for (double& x : p) x /= sum;
    for (int64_t c = 0; c < d; ++c)
      for (int64_t j = 0; j <= i; ++j) r.out[size_t(i * d + c)] += p[size_t(j)] * at(v, j, c);
    // dP_j = w_i . v_j, dS_j = P_j (dP_j - sum_l P_l dP_l).
    std::vector<double> dp(size_t(i + 1));
    double pdp = 0;
    for (int64_t j = 0; j <= i; ++j) {
      for (int64_t c = 0; c < d; ++c) dp[size_t(j)] += at(w, i, c) * at(v, j, c);
      pdp += p[size_t(j)] * dp[size_t(j)];
    }
    for (int64_t j = 0; j <= i; ++j) {
      const double ds = p[size_t(j)] * (dp[size_t(j)] - pdp);
      for (int64_t c = 0; c < d; ++c) {
        r.gq[size_t(i * d + c)] += ds * at(k, j, c) * scale;
        r.gk[size_t(j * d + c)] += ds * at(q, i, c) * scale;
        r.gv[size_t(j * d + c)] += p[size_t(j)] * at(w, i, c);
      }
    }
  }
  return r;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << what << " " << i;
}

TEST(CausalAttention, HandCheckedRows) {
  // scale 1 / sqrt(2). Row 0: out = v0 = [1, 0]. Row 1: scores q1.k0 = 2, q1.k1 = -1, so
  // out = (e^{2s} v0 + e^{-s} v1) / (e^{2s} + e^{-s}) with s = 1/sqrt(2).
  const double s = 1 / std::sqrt(2.0);
  const double a = std::exp(2 * s), b = std::exp(-s);
  const Tensor q = from_vector<double>(kQ, {1, 1, 3, 2}), k = from_vector<double>(kK, {1, 1, 3, 2});
  const Tensor v = from_vector<double>(kV, {1, 1, 3, 2});
  const std::vector<double> got = causal_attention(q, k, v).to_vector<double>();
  EXPECT_NEAR(got[0], 1.0, 1e-15);
  EXPECT_NEAR(got[1], 0.0, 1e-15);
  EXPECT_NEAR(got[2], a / (a + b), 1e-15);
  EXPECT_NEAR(got[3], b / (a + b), 1e-15);
  const std::vector<double> w(6, 1.0);
  expect_near(got, reference(3, 2, kQ, kK, kV, w, s).out, 1e-15, "out");
  // An explicit scale, and f32.
  expect_near(causal_attention(q, k, v, 2.0).to_vector<double>(),
              reference(3, 2, kQ, kK, kV, w, 2.0).out, 1e-14, "out, scale 2");
  expect_near(
      causal_attention(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32)).to_vector<double>(),
      reference(3, 2, kQ, kK, kV, w, s).out, 1e-6, "out in f32");
}

TEST(CausalAttention, GradientsMatchTheFormulas) {
  Generator gen(5);
  const int64_t t = 6, d = 3;
  const Tensor q0 = rand({1, 1, t, d}, gen, DType::f64), k0 = rand({1, 1, t, d}, gen, DType::f64);
  const Tensor v0 = rand({1, 1, t, d}, gen, DType::f64), w = rand({1, 1, t, d}, gen, DType::f64);
  Tensor q = q0.clone().detach(), k = k0.clone().detach(), v = v0.clone().detach();
  q.set_requires_grad(true);
  k.set_requires_grad(true);
  v.set_requires_grad(true);
  const Tensor out = causal_attention(q, k, v, 0.8);
  sum(mul(out, w)).backward();
  const Reference r = reference(t, d, q0.to_vector<double>(), k0.to_vector<double>(),
                                v0.to_vector<double>(), w.to_vector<double>(), 0.8);
  expect_near(out.to_vector<double>(), r.out, 1e-14, "out");
  expect_near(q.grad().to_vector<double>(), r.gq, 1e-14, "gq");
  expect_near(k.grad().to_vector<double>(), r.gk, 1e-14, "gk");
  expect_near(v.grad().to_vector<double>(), r.gv, 1e-14, "gv");
}

TEST(CausalAttention, HeadsAreIndependent) {
  // [2, 3, 5, 4]: each (b, h) slice equals the single-head result on that slice.
  Generator gen(9);
  const Tensor q = rand({2, 3, 5, 4}, gen, DType::f64), k = rand({2, 3, 5, 4}, gen, DType::f64);
  const Tensor v = rand({2, 3, 5, 4}, gen, DType::f64);
  const std::vector<double> all = causal_attention(q, k, v).to_vector<double>();
  const std::vector<double> qa = q.to_vector<double>(), ka = k.to_vector<double>();
  const std::vector<double> va = v.to_vector<double>();
  const std::vector<double> w(20, 1.0);
  for (size_t h = 0; h < 6; ++h) {
    const auto slice = [h](const std::vector<double>& x) {
      return std::vector<double>(x.begin() + long(h * 20), x.begin() + long(h * 20 + 20));
    };
    expect_near(slice(all), reference(5, 4, slice(qa), slice(ka), slice(va), w, 0.5).out, 1e-14,
                "head");
  }
}

TEST(CausalAttention, MatchesTheComposedOps) {
  // One head as softmax(q k^T * scale + mask) v from linear (q k^T), add, softmax and matmul,
  // the mask -1e30 above the diagonal; outputs and gradients of sum(out * w) in f64. T = 150
  // crosses the CPU kernel's blocks of 64 query rows (the last one partial).
  for (const int64_t t : {9, 150}) {
    Generator gen(13);
    const int64_t d = 5;
    const double scale = 1 / std::sqrt(double(d));
    std::vector<double> mask(size_t(t * t), 0.0);
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = i + 1; j < t; ++j) mask[size_t(i * t + j)] = -1e30;
    const Tensor w = randn({t, d}, gen, DType::f64);
    std::vector<Tensor> leaves;
    for (int n = 0; n < 6; ++n) {  // q, k, v for the op, then copies for the composition
      if (n < 3)
        leaves.push_back(randn({t, d}, gen, DType::f64));
      else
        leaves.push_back(leaves[size_t(n - 3)].clone().detach());
      leaves.back().set_requires_grad(true);
    }
    const Shape four = {1, 1, t, d};
    const Tensor out =
        causal_attention(leaves[0].reshape(four), leaves[1].reshape(four), leaves[2].reshape(four))
            .reshape({t, d});
    sum(mul(out, w)).backward();
    const Tensor scores =
        add(mul(linear(leaves[3], leaves[4]), scale), from_vector<double>(mask, {t, t}));
    const Tensor composed = matmul(softmax(scores, 1), leaves[5]);
    sum(mul(composed, w)).backward();
    expect_near(out.to_vector<double>(), composed.to_vector<double>(), 1e-14, "out");
    const char* names[] = {"gq", "gk", "gv"};
    for (size_t n = 0; n < 3; ++n)
      expect_near(leaves[n].grad().to_vector<double>(), leaves[n + 3].grad().to_vector<double>(),
                  1e-13, names[n]);
  }
}

TEST(CausalAttention, ShapeErrors) {
  expect_error(
      [] {
        causal_attention(zeros({2, 3, 4}), zeros({2, 3, 4}), zeros({2, 3, 4}));
      },
      "causal_attention: expected q, k, v of shape [B, H, T, Dh]");
  expect_error(
      [] {
        causal_attention(zeros({1, 1, 3, 4}), zeros({1, 1, 3, 4}), zeros({1, 1, 2, 4}));
      },
      "causal_attention: q, k and v must have one shape");
}

}  // namespace
}  // namespace rg
