// causal_attention against a hand-checkable case, f64 loops of its formulas and the same
// attention composed from existing ops, with and without dropout on the probabilities (the op
// table checks gradients, devices and dtypes).
#include "engine/ops/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/ops/matmul.h"
#include "engine/ops/reduce.h"
#include "engine/ops/shape.h"
#include "kernels/attention.h"
#include "kernels/philox.h"
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

// The dropout multipliers of head r, [t, t], by a plain loop over kernels/attention.h's layout:
// word j % 4 of Philox counter offset + (r * t + i) * ceil(t / 4) + j / 4, kept (1 / (1 - p))
// when its top 24 bits reach ceil(p 2^24), else 0.
std::vector<double> dropout_mask(uint64_t seed, uint64_t offset, int64_t r, int64_t t, double p) {
  std::vector<double> m(size_t(t * t));
  const uint64_t per_row = uint64_t((t + 3) / 4);
  const auto threshold = static_cast<uint32_t>(std::ceil(p * 16777216.0));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < t; ++j) {
      const philox::U32x4 w =
          philox::block(seed, offset + uint64_t(r * t + i) * per_row + uint64_t(j / 4));
      m[size_t(i * t + j)] = (w.v[j % 4] >> 8) >= threshold ? 1 / (1 - p) : 0.0;
    }
  return m;
}

// FNV-1a over a tensor's bytes: pins results bit for bit.
uint64_t bits_hash(const Tensor& x) {
  const Tensor& c = x;
  const auto* b = static_cast<const unsigned char*>(c.raw_data());
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < c.numel() * int64_t(element_size(c.dtype())); ++i)
    h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

TEST(CausalAttention, ZeroDropoutIsTheDropoutFreeKernel) {
  // p = 0 through a generator: the same bits as the call without dropout arguments (the
  // dropout-free code path; no counters drawn), outputs and the gradients of sum(out * w). (That
  // path gives the bits of the kernels before dropout existed, commit 9433f04: checked once by
  // building both side by side; not pinned here as hashes, since OpenBLAS picks its GEMM kernels
  // by CPU.)
  Generator gen(21);
  const Shape s = {2, 2, 150, 16};
  const Tensor q0 = randn(s, gen), k0 = randn(s, gen), v0 = randn(s, gen), w = randn(s, gen);
  std::vector<uint64_t> hashes[2];
  for (int with_gen = 0; with_gen < 2; ++with_gen) {
    Tensor q = q0.clone().detach(), k = k0.clone().detach(), v = v0.clone().detach();
    for (Tensor* x : {&q, &k, &v}) x->set_requires_grad(true);
    Generator drop(5);
    const Tensor out =
        with_gen ? causal_attention(q, k, v, 0, 0.0, &drop) : causal_attention(q, k, v);
    sum(mul(out, w)).backward();
    EXPECT_EQ(drop.offset(), 0u);
    hashes[with_gen] = {bits_hash(out), bits_hash(q.grad()), bits_hash(k.grad()),
                        bits_hash(v.grad())};
  }
  EXPECT_EQ(hashes[0], hashes[1]);
}

TEST(CausalAttention, DropoutMatchesTheComposedOpsWithThePhiloxMask) {
  // Two heads at T = 150 (the CPU's blocks of 64 rows, the last partial; a head index in the
  // layout): out = (softmax(q k^T * scale + causal mask) . M) v per head from existing ops, M
  // rebuilt by dropout_mask; outputs and gradients of sum(out * w) in f64.
  const int64_t t = 150, d = 5, heads = 2;
  const double p = 0.3, scale = 1 / std::sqrt(double(d));
  Generator gen(17);
  std::vector<double> causal(size_t(t * t), 0.0);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = i + 1; j < t; ++j) causal[size_t(i * t + j)] = -1e30;
  const Tensor w = randn({heads * t, d}, gen, DType::f64);
  std::vector<Tensor> leaves;
  for (int n = 0; n < 6; ++n) {  // q, k, v for the op, then copies for the composition
    leaves.push_back(n < 3 ? randn({heads * t, d}, gen, DType::f64)
                           : leaves[size_t(n - 3)].clone().detach());
    leaves.back().set_requires_grad(true);
  }
  Generator drop;
  drop.set_state(0x5EEDull << 32 | 7, 12345);  // both key words matter
  const Shape four = {1, heads, t, d};
  const Tensor out = causal_attention(leaves[0].reshape(four), leaves[1].reshape(four),
                                      leaves[2].reshape(four), 0, p, &drop)
                         .reshape({heads * t, d});
  EXPECT_EQ(drop.offset(), 12345u + kernels::attention_dropout_groups(heads, t));
  EXPECT_EQ(kernels::attention_dropout_groups(heads, t), uint64_t(heads * t * 38));
  sum(mul(out, w)).backward();
  const std::vector<Tensor> q = split(leaves[3], t), k = split(leaves[4], t),
                            v = split(leaves[5], t);
  std::vector<Tensor> parts;
  for (int64_t h = 0; h < heads; ++h) {
    const Tensor scores =
        add(mul(linear(q[size_t(h)], k[size_t(h)]), scale), from_vector<double>(causal, {t, t}));
    const Tensor mask = from_vector<double>(dropout_mask(drop.seed(), 12345, h, t, p), {t, t});
    parts.push_back(matmul(mul(softmax(scores, 1), mask), v[size_t(h)]));
  }
  Tensor composed = sum(mul(parts[0], split(w, t)[0])) + sum(mul(parts[1], split(w, t)[1]));
  composed.backward();
  std::vector<double> want = parts[0].to_vector<double>();
  for (double x : parts[1].to_vector<double>()) want.push_back(x);
  expect_near(out.to_vector<double>(), want, 1e-14, "out");
  const char* names[] = {"gq", "gk", "gv"};
  for (size_t n = 0; n < 3; ++n)
    expect_near(leaves[n].grad().to_vector<double>(), leaves[n + 3].grad().to_vector<double>(),
                1e-13, names[n]);
  // Without the mask the composition is far off: the mask matters.
  const Tensor undropped =
      causal_attention(leaves[0].reshape(four).detach(), leaves[1].reshape(four).detach(),
                       leaves[2].reshape(four).detach());
  const std::vector<double> u = undropped.to_vector<double>(), o = out.to_vector<double>();
  double far = 0;
  for (size_t i = 0; i < u.size(); ++i) far = std::max(far, std::abs(u[i] - o[i]));
  EXPECT_GT(far, 0.1);
}

TEST(CausalAttention, DropsAboutPOfTheProbabilities) {
  // q = k = 0 makes P_ij = 1 / (i + 1) for j <= i, and v = identity (d = t) puts P_ij M_ij in
  // out[i, j]: a zero there is a dropped probability. 64 heads of t = 64: 133120 probabilities.
  const int64_t bh = 64, t = 64;
  std::vector<double> eye(size_t(bh * t * t), 0.0);
  for (int64_t r = 0; r < bh; ++r)
    for (int64_t i = 0; i < t; ++i) eye[size_t((r * t + i) * t + i)] = 1;
  const Tensor z = zeros({1, bh, t, t}), v = from_vector<double>(eye, {1, bh, t, t}).to(DType::f32);
  for (const double p : {0.1, 0.5}) {
    Generator drop(3);
    const Tensor first = causal_attention(z, z, v, 0, p, &drop);
    const std::vector<float> out = first.to_vector<float>();
    int64_t dropped = 0, total = 0;
    for (int64_t r = 0; r < bh; ++r)
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < t; ++j) {
          const float x = out[size_t((r * t + i) * t + j)];
          if (j > i) {
            EXPECT_EQ(x, 0.0f);
            continue;
          }
          ++total;
          if (x == 0.0f)
            ++dropped;
          else
            EXPECT_NEAR(x, 1 / ((i + 1) * (1 - p)), 1e-5);
        }
    ASSERT_EQ(total, bh * t * (t + 1) / 2);
    EXPECT_NEAR(double(dropped) / double(total), p, 0.01) << "p " << p;
    // The next call draws the next counters: another mask.
    EXPECT_NE(bits_hash(causal_attention(z, z, v, 0, p, &drop)), bits_hash(first));
  }
}

TEST(CausalAttention, DropoutProbabilityIsChecked) {
  const Tensor x = zeros({1, 1, 3, 4});
  Generator gen(1);
  expect_error([&] { causal_attention(x, x, x, 0, 1.0, &gen); },
               "causal_attention: dropout_p must be in [0, 1), got 1");
  expect_error([&] { causal_attention(x, x, x, 0, -0.1, &gen); },
               "causal_attention: dropout_p must be in [0, 1), got -0.1");
  EXPECT_EQ(gen.offset(), 0u);
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
