// sync_batch_norm: our batch-norm kernels (kernels/batch_norm.h, both devices) around two
// collectives; the gathered statistics are combined on the host in f64 (2C + 1 values per replica).
#include "engine/ops/sync_batch_norm.h"

#include <cmath>
#include <vector>

#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/dispatch.h"
#include "engine/ops/batch_norm.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "kernels/batch_norm.h"
#include "kernels/error.h"

namespace rg {

using autograd::SavedTensor;

namespace {

// The global per-channel statistics, f64 on the host.
struct GlobalStats {
  std::vector<double> mean, var, invstd;
  int64_t count = 0;
};

// Combines rows of [mean(c), var(c), count] (one per replica) weighted by their counts: the global
// mean, then the biased variance as the count-weighted mean of var_r + (mean_r - mean)^2 (Chan et
// al.'s pairwise formula, batch_norm_gather_stats_with_counts' result). Rows with count 0 (empty
// batches) drop out.
GlobalStats combine(const std::vector<double>& rows, int64_t c, double eps) {
  const size_t width = size_t(2 * c + 1);
  const size_t replicas = rows.size() / width;
  GlobalStats g;
  g.mean.assign(size_t(c), 0.0);
  g.var.assign(size_t(c), 0.0);
  g.invstd.assign(size_t(c), 0.0);
  double total = 0;
  for (size_t r = 0; r < replicas; ++r) total += rows[r * width + width - 1];
  g.count = int64_t(total);
  if (total <= 0) return g;
  for (int64_t ch = 0; ch < c; ++ch) {
    double mean = 0;
    for (size_t r = 0; r < replicas; ++r) {
      const double* row = rows.data() + r * width;
      mean += row[width - 1] * row[ch];
    }
    mean /= total;
    double var = 0;
    for (size_t r = 0; r < replicas; ++r) {
      const double* row = rows.data() + r * width;
      const double d = row[ch] - mean;
      var += row[width - 1] * (row[c + ch] + d * d);
    }
    var /= total;
    g.mean[size_t(ch)] = mean;
    g.var[size_t(ch)] = var;
    g.invstd[size_t(ch)] = 1.0 / std::sqrt(var + eps);
  }
  return g;
}

Tensor device_vector(const std::vector<double>& v, Device device) {
  return from_vector(v, {int64_t(v.size())}, DType::f64).to(device);
}

}  // namespace

Tensor sync_batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps,
                       std::shared_ptr<BatchNormCollectives> collectives) {
  const char* op = "sync_batch_norm";
  check_inputs(op, {x});
  if (auto out = detail::batch_norm_through_f32(
          x, running_mean, running_var, weight, bias, /*training=*/true,
          [&](const Tensor& x32, const Tensor& rm, const Tensor& rv, const Tensor& w,
              const Tensor& b) {
            return sync_batch_norm(x32, rm, rv, w, b, momentum, eps, collectives);
          })) {
    return *out;
  }
  const auto [n, c, hw] =
      detail::check_batch_norm_args(op, x, running_mean, running_var, weight, bias, eps);
  RG_CHECK(collectives != nullptr, op, ": collectives must not be null");
  const Device device = x.device();

  // This replica's [mean(c), var(c), count]; zeros for an empty batch, which must still join the
  // gather so that the others do not wait.
  const int64_t local_count = n * hw;
  Tensor local = zeros({2 * c + 1}, DType::f64, device);
  dispatch_on(device, x.dtype(), op, [&]<class T, class B>() {
    if (local_count > 0) {
      using K = kernels::BatchNorm<B>;
      const Tensor ws = Tensor::empty({K::workspace_bytes(n, c, hw)}, DType::u8, device);
      K::stats(x.data<T>(), n, c, hw, local.data<double>(), local.data<double>() + c, nullptr, eps,
               kernels::Workspace{ws.raw_data(), ws.numel()}, kernel_ctx(x));
    }
  });
  local.narrow(0, 2 * c, 1).fill_(double(local_count));
  const Tensor gathered = collectives->all_gather(local);
  RG_CHECK(gathered.numel() == int64_t(collectives->size()) * local.numel(), op,
           ": the gathered statistics have ", gathered.numel(), " values, expected ",
           collectives->size(), " x ", local.numel());
  const GlobalStats g = combine(gathered.to(Device::cpu()).to_vector<double>(), c, eps);
  RG_CHECK(g.count > 1, op, ": expected more than 1 value per channel when training, got ", g.count,
           " over all replicas (input ", shape_str(x.shape()), " here)");

  const Tensor mean = device_vector(g.mean, device);
  const Tensor invstd = device_vector(g.invstd, device);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
  dispatch_on(device, x.dtype(), op, [&]<class T, class B>() {
    using K = kernels::BatchNorm<B>;
    if (running_mean.defined()) {
      const Tensor var = device_vector(g.var, device);
      K::update_running(running_mean.data<T>(), running_var.data<T>(), mean.data<double>(),
                        var.data<double>(), c, g.count, momentum, kernel_ctx(x));
    }
    K::apply(x.data<T>(), n, c, hw, mean.data<double>(), invstd.data<double>(),
             weight.defined() ? weight.data<T>() : nullptr,
             bias.defined() ? bias.data<T>() : nullptr, static_cast<const T*>(nullptr), false,
             out.data<T>(),
             kernel_ctx(x));
  });
  if (running_mean.defined()) {
    running_mean.bump_version();
    running_var.bump_version();
  }

  const bool gx = autograd::needs_grad({x}), gw = autograd::needs_grad({weight});
  const bool gb = autograd::needs_grad({bias});
  return autograd::record(
      out, "SyncBatchNormBackward", {x, weight, bias},
      [sx = SavedTensor(x), sw = SavedTensor(weight), mean, invstd, count = g.count, collectives,
       gx, gw, gb, n, c, hw](const Tensor& grad) -> std::vector<Tensor> {
        NoGradGuard no_grad;
        const Tensor xv = sx.get(), wv = sw.get();
        // This replica's sum(dy) and sum(dy * xhat) over the global statistics: its own bias and
        // weight gradients, and its share of the global sums the input gradient needs.
        Tensor sums = zeros({2 * c}, DType::f64, grad.device());
        Tensor dx, dw, db;
        dispatch_on(
            grad.device(), grad.dtype(), "sync_batch_norm backward", [&]<class T, class B>() {
              if (n * hw > 0) {
                kernels::BatchNorm<B>::backward_reduce(grad.data<T>(), xv.data<T>(), n, c, hw,
                                                       mean.data<double>(), invstd.data<double>(),
                                                       sums.data<double>(), kernel_ctx(grad));
              }
            });
        if (gb) db = sums.narrow(0, 0, c).to(grad.dtype()).clone();
        if (gw) dw = sums.narrow(0, c, c).to(grad.dtype()).clone();
        if (gx) {
          // As PyTorch: one all-reduce, only when the input gradient is wanted (every replica
          // has the same graph, so all of them take it or none).
          collectives->all_reduce_sum(sums);
          dx = Tensor::empty(xv.shape(), grad.dtype(), grad.device());
          dispatch_on(grad.device(), grad.dtype(), "sync_batch_norm backward",
                      [&]<class T, class B>() {
                        kernels::BatchNorm<B>::backward_elemt(
                            grad.data<T>(), xv.data<T>(), n, c, hw, mean.data<double>(),
                            invstd.data<double>(), wv.defined() ? wv.data<T>() : nullptr,
                            sums.data<double>(), count, dx.data<T>(), kernel_ctx(grad));
                      });
        }
        return {dx, dw, db};
      });
}

}  // namespace rg
