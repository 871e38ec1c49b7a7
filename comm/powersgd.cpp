// PowerSGD's three phases in tensor ops, so the same code runs on the CPU and on a CUDA device
// (each on the caller's current stream there): GEMMs into windows of the flat buffers
// (matmul_out) and Gram-Schmidt in f64 for the orthonormalization (orthonormalize_columns_; P
// has few columns, and f32 Gram-Schmidt loses orthogonality when they are nearly dependent).
#include "comm/powersgd.h"

#include "engine/autograd/grad_mode.h"
#include "engine/generator.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/matmul.h"
#include "engine/ops/orthonormalize.h"
#include "kernels/error.h"

namespace rg::dist {
namespace {

// The same Q on every rank: drawn from (seed, bucket) on the host, then moved to the bucket's
// device.
Tensor initial_q(uint64_t seed, size_t id, int64_t q_total, Device device) {
  Generator gen(seed + id);
  return randn({std::max<int64_t>(q_total, 1)}, gen).to(device);
}

// Row-major [rows, cols] window of a flat tensor.
Tensor matrix(const Tensor& flat, int64_t offset, int64_t rows, int64_t cols) {
  return flat.flat_narrow(offset, rows * cols).view({rows, cols});
}

}  // namespace

Tensor PowerSgd::begin(size_t id, const Tensor& flat, const std::vector<Shape>& shapes) {
  NoGradGuard no_grad;
  RG_CHECK(flat.dtype() == DType::f32, "PowerSGD compresses f32 buckets only");
  const Device device = flat.device();
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
    b.error = zeros({flat.numel()}, DType::f32, device);
    b.q = initial_q(opt_.seed, id, b.q_total, device);
    if (const auto it = restored_.find(id); it != restored_.end()) {
      const BucketState& r = it->second;
      const int64_t q_numel = std::max<int64_t>(b.q_total, 1);
      RG_CHECK(r.q.defined() && r.q.numel() == q_numel,
               "PowerSGD: the restored Q factors of bucket ", id, " have ",
               r.q.defined() ? r.q.numel() : 0, " elements, its layout needs ", q_numel,
               " (state of another model, bucket layout or --powersgd-rank?)");
      RG_CHECK(!r.error.defined() || r.error.numel() == flat.numel(),
               "PowerSGD: the restored error of bucket ", id, " has ", r.error.numel(),
               " elements, the bucket ", flat.numel());
      if (opt_.warm_start) b.q = r.q.to(device).to(DType::f32).clone();
      if (r.error.defined()) b.error = r.error.to(device).to(DType::f32).clone();
      restored_.erase(it);
    }
  } else if (!opt_.warm_start) {
    b.q = initial_q(opt_.seed, id, b.q_total, device);
  }
  // Back to this rank's own gradient (the bucket holds gradient / world_size), plus the error.
  Tensor m = flat;
  mul_(m, double(world_));
  if (opt_.error_feedback) add_(m, b.error);
  Tensor out = Tensor::empty({b.uncompressed + b.p_total}, DType::f32, device);
  int64_t u = 0, p = b.uncompressed, qo = 0;
  for (const Entry& e : b.entries) {
    if (!e.r) {
      out.flat_narrow(u, e.numel).copy_(flat.flat_narrow(e.offset, e.numel));
      u += e.numel;
      continue;
    }
    // P (n x r) = M (n x m) Q (m x r)
    matmul_out(matrix(flat, e.offset, e.n, e.m), false, matrix(b.q, qo, e.m, e.r), false,
               matrix(out, p, e.n, e.r));
    p += e.n * e.r;
    qo += e.m * e.r;
  }
  return out;
}

Tensor PowerSgd::middle(size_t id, const Tensor& flat, const Tensor& reduced_p) {
  NoGradGuard no_grad;
  Bucket& b = buckets_.at(id);
  b.reduced_p = reduced_p;
  Tensor q = Tensor::empty({std::max<int64_t>(b.q_total, 1)}, DType::f32, flat.device());
  int64_t p = b.uncompressed, qo = 0;
  for (const Entry& e : b.entries) {
    if (!e.r) continue;
    const Tensor pm = matrix(reduced_p, p, e.n, e.r);
    orthonormalize_columns_(pm);
    // Q (m x r) = M^T (m x n) P (n x r)
    matmul_out(matrix(flat, e.offset, e.n, e.m), true, pm, false, matrix(q, qo, e.m, e.r));
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
  if (b.uncompressed > 0) {
    Tensor u_avg = b.reduced_p.flat_narrow(0, b.uncompressed);
    mul_(u_avg, 1.0 / world_);
  }
  b.q = reduced_q;  // warm start: next iteration begins from this Q
  int64_t u = 0, p = b.uncompressed, qo = 0;
  for (const Entry& e : b.entries) {
    Tensor mine = flat.flat_narrow(e.offset, e.numel);
    Tensor err = b.error.flat_narrow(e.offset, e.numel);
    if (!e.r) {
      mine.copy_(b.reduced_p.flat_narrow(u, e.numel));
      err.zero_();
      u += e.numel;
      continue;
    }
    // approx (n x m) = P (n x r) Q^T (r x m)
    const Tensor approx = Tensor::empty({e.n, e.m}, DType::f32, flat.device());
    matmul_out(matrix(b.reduced_p, p, e.n, e.r), false, matrix(reduced_q, qo, e.m, e.r), true,
               approx);
    const Tensor approx_flat = approx.view({e.numel});
    if (opt_.error_feedback) err.copy_(sub(mine, approx_flat));
    mine.copy_(approx_flat);
    p += e.n * e.r;
    qo += e.m * e.r;
  }
  b.reduced_p = Tensor();
}

PowerSgd::State PowerSgd::state() const {
  NoGradGuard no_grad;
  State out;
  for (const auto& [id, b] : buckets_) out[id] = {b.error.clone(), b.q.clone()};
  // Entries restored but not taken yet (no iteration since load_state) are still the state.
  for (const auto& [id, r] : restored_)
    if (!out.count(id)) out[id] = {r.error.defined() ? r.error.clone() : Tensor(), r.q.clone()};
  return out;
}

void PowerSgd::load_state(State state) {
  for (const auto& [id, r] : state)
    RG_CHECK(r.q.defined(), "PowerSGD: the state of bucket ", id, " has no Q factors");
  buckets_.clear();
  restored_ = std::move(state);
}

}  // namespace rg::dist
