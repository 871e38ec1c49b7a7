// PowerSGD's three phases on the CPU: OpenBLAS GEMMs for the factors, Gram-Schmidt in f64 for
// the orthonormalization (P has few columns, and f32 Gram-Schmidt loses orthogonality when they
// are nearly dependent).
#include "comm/powersgd.h"

#include <cmath>
#include <cstring>

#include "engine/autograd/grad_mode.h"
#include "engine/generator.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "kernels/cpu/gemm.h"
#include "kernels/error.h"

namespace rg::dist {
namespace {

namespace kcpu = rg::kernels::cpu;

// Columns of the row-major n x r matrix `p` made orthonormal in place: modified Gram-Schmidt in
// f64, twice ("twice is enough" for orthogonality to working precision). A column that is
// (numerically) a combination of the previous ones becomes zero rather than normalized noise,
// which would overlap the others and double-count their directions.
void orthonormalize(float* p, int64_t n, int64_t r) {
  std::vector<double> q(static_cast<size_t>(n * r));
  for (int64_t k = 0; k < n * r; ++k) q[size_t(k)] = p[k];
  auto at = [&](int64_t row, int64_t col) -> double& { return q[size_t(row * r + col)]; };
  for (int64_t i = 0; i < r; ++i) {
    double before = 0;
    for (int64_t k = 0; k < n; ++k) before += at(k, i) * at(k, i);
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t j = 0; j < i; ++j) {
        double dot = 0;
        for (int64_t k = 0; k < n; ++k) dot += at(k, j) * at(k, i);
        for (int64_t k = 0; k < n; ++k) at(k, i) -= dot * at(k, j);
      }
    double norm = 0;
    for (int64_t k = 0; k < n; ++k) norm += at(k, i) * at(k, i);
    norm = std::sqrt(norm);
    const double scale = norm > 1e-6 * std::sqrt(before) && norm > 0 ? 1.0 / norm : 0.0;
    for (int64_t k = 0; k < n; ++k) at(k, i) *= scale;
  }
  for (int64_t k = 0; k < n * r; ++k) p[k] = float(q[size_t(k)]);
}

}  // namespace

Tensor PowerSgd::begin(size_t id, const Tensor& flat, const std::vector<Shape>& shapes) {
  NoGradGuard no_grad;
  RG_CHECK(flat.dtype() == DType::f32, "PowerSGD compresses f32 buckets only");
  Bucket& b = buckets_[id];
  if (b.entries.empty()) {  // first time: layout, zero error, random Q (same seed everywhere)
    int64_t offset = 0;
    for (const Shape& s : shapes) {
      Entry e;
      e.offset = offset;
      e.numel = shape_numel(s);
      offset += e.numel;
      if (s.size() >= 2) {
        e.n = s[0];
        e.m = e.numel / e.n;
        const int64_t r = std::min<int64_t>({opt_.rank, e.n, e.m});
        if (double(e.n * e.m) >= opt_.min_compression_rate * double((e.n + e.m) * r)) e.r = r;
      }
      if (e.r) {
        b.p_total += e.n * e.r;
        b.q_total += e.m * e.r;
      } else {
        b.uncompressed += e.numel;
      }
      b.entries.push_back(e);
    }
    RG_CHECK(offset == flat.numel(), "PowerSGD: shapes do not cover the bucket");
    b.error = zeros({flat.numel()});
    Generator gen(opt_.seed + id);
    b.q = randn({std::max<int64_t>(b.q_total, 1)}, gen);
  } else if (!opt_.warm_start) {
    Generator gen(opt_.seed + id);
    b.q = randn({std::max<int64_t>(b.q_total, 1)}, gen);
  }
  // Back to this rank's own gradient (the bucket holds gradient / world_size), plus the error.
  Tensor m = flat;
  mul_(m, double(world_));
  if (opt_.error_feedback) add_(m, b.error);
  Tensor out = Tensor::empty({b.uncompressed + b.p_total});
  float* o = out.data<float>();
  const float* src = flat.data<float>();
  const float* q = b.q.data<float>();
  int64_t u = 0, p = b.uncompressed, qo = 0;
  for (const Entry& e : b.entries) {
    if (!e.r) {
      std::memcpy(o + u, src + e.offset, size_t(e.numel) * sizeof(float));
      u += e.numel;
      continue;
    }
    // P (n x r) = M (n x m) Q (m x r)
    kcpu::gemm<float>(false, false, e.n, e.r, e.m, 1.f, src + e.offset, e.m, q + qo, e.r, 0.f,
                      o + p, e.r);
    p += e.n * e.r;
    qo += e.m * e.r;
  }
  return out;
}

Tensor PowerSgd::middle(size_t id, const Tensor& flat, const Tensor& reduced_p) {
  Bucket& b = buckets_.at(id);
  b.reduced_p = reduced_p;
  float* p = reduced_p.data<float>() + b.uncompressed;
  const float* m = flat.data<float>();
  Tensor q = Tensor::empty({std::max<int64_t>(b.q_total, 1)});
  float* qo = q.data<float>();
  for (const Entry& e : b.entries) {
    if (!e.r) continue;
    orthonormalize(p, e.n, e.r);
    // Q (m x r) = M^T (m x n) P (n x r)
    kcpu::gemm<float>(true, false, e.m, e.r, e.n, 1.f, m + e.offset, e.m, p, e.r, 0.f, qo, e.r);
    p += e.n * e.r;
    qo += e.m * e.r;
  }
  return q;
}

void PowerSgd::finish(size_t id, const Tensor& flat, const Tensor& reduced_q) {
  NoGradGuard no_grad;
  Bucket& b = buckets_.at(id);
  // The all-reduces summed local gradients; the averages are what DDP writes back.
  Tensor q_avg = reduced_q;
  mul_(q_avg, 1.0 / world_);
  Tensor p_all = b.reduced_p;
  if (b.uncompressed > 0) {
    Tensor u_avg = p_all.flat_narrow(0, b.uncompressed);
    mul_(u_avg, 1.0 / world_);
  }
  b.q = reduced_q;  // warm start: next iteration begins from this Q
  float* mflat = flat.data<float>();
  float* err = b.error.data<float>();
  const float* u = b.reduced_p.data<float>();
  const float* p = u + b.uncompressed;
  const float* q = reduced_q.data<float>();
  std::vector<float> approx;
  for (const Entry& e : b.entries) {
    float* mine = mflat + e.offset;
    if (!e.r) {
      std::memcpy(mine, u, size_t(e.numel) * sizeof(float));
      std::fill(err + e.offset, err + e.offset + e.numel, 0.f);
      u += e.numel;
      continue;
    }
    approx.resize(size_t(e.numel));
    // approx (n x m) = P (n x r) Q^T (r x m)
    kcpu::gemm<float>(false, true, e.n, e.m, e.r, 1.f, p, e.r, q, e.r, 0.f, approx.data(), e.m);
    for (int64_t k = 0; k < e.numel; ++k) {
      if (opt_.error_feedback) err[e.offset + k] = mine[k] - approx[size_t(k)];
      mine[k] = approx[size_t(k)];
    }
    p += e.n * e.r;
    q += e.m * e.r;
  }
  b.reduced_p = Tensor();
}

}  // namespace rg::dist
