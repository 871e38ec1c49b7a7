// SyncBatchNorm under DDP against one process with the whole batch and plain batch norm, and one
// layer against batch_norm on the concatenated batch: the shared bodies of
// tests/dist/sync_batch_norm_test.cpp (CPU, gloo) and tests/dist/sync_batch_norm_device_test.cpp
// (emulated CUDA, NCCL or staged gloo). Header-only so the emulated-device test binaries (linked
// against the _emu libraries) can use it too.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "comm/ddp.h"
#include "comm/sync_batch_norm.h"
#include "data/synthetic.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/batch_norm.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/ops/reduce.h"
#include "kernels/error.h"
#include "layers/module.h"
#include "layers/optim/optimizer.h"
#include "layers/sync_batch_norm.h"

namespace rg::testing {

// The largest relative difference max|a - b| / scale over same-named tensors, in f64 whatever
// their dtype and device; `worst` names its tensor. A tensor's scale is its max|b|, but at least
// 1e-3 of the largest max|b| of all: a tensor whose true value is 0 holds rounding noise only
// (the gradient of a conv bias followed by batch norm, which cancels it).
inline double max_relative_difference(const NamedTensors& a, const NamedTensors& b,
                                      std::string* worst = nullptr) {
  RG_CHECK(a.size() == b.size(), "different tensor counts: ", a.size(), " vs ", b.size());
  std::vector<double> diffs, scales;
  for (size_t i = 0; i < a.size(); ++i) {
    RG_CHECK(a[i].first == b[i].first, "tensor ", i, " is ", a[i].first, " vs ", b[i].first);
    const auto va = a[i].second.to(DType::f64).to_vector<double>();
    const auto vb = b[i].second.to(DType::f64).to_vector<double>();
    RG_CHECK(va.size() == vb.size(), a[i].first, " differs in size");
    double diff = 0, scale = 0;
    for (size_t k = 0; k < va.size(); ++k) {
      diff = std::max(diff, std::fabs(va[k] - vb[k]));
      scale = std::max(scale, std::fabs(vb[k]));
    }
    diffs.push_back(diff);
    scales.push_back(scale);
  }
  const double floor =
      1e-3 * (scales.empty() ? 0.0 : *std::max_element(scales.begin(), scales.end()));
  double result = 0;
  for (size_t i = 0; i < diffs.size(); ++i) {
    const double scale = std::max(scales[i], floor);
    const double rel = scale > 0 ? diffs[i] / scale : diffs[i];
    if (rel > result || (worst && worst->empty())) {
      result = std::max(result, rel);
      if (worst) *worst = a[i].first;
    }
  }
  return result;
}

inline NamedTensors named_gradients(const nn::Module& m) {
  NamedTensors g;
  for (const auto& [name, p] : m.named_parameters()) g.emplace_back(name, p.grad());
  return g;
}

struct SyncBnRun {
  std::function<std::shared_ptr<nn::Module>()> make_model;  // the same weights on every call
  Shape sample_shape;
  std::vector<int64_t> sizes;  // the batch of each rank
  int steps = 3;
  DType dtype = DType::f64;       // of both models
  Device device = Device::cpu();  // of the DDP model
  Device reference_device = Device::cpu();
  bool convert = true;  // false: plain batch norm under DDP (a control that must differ)
};

// The worst relative differences over the steps, DDP (this rank) against the reference.
struct SyncBnDiffs {
  double grads = 0, params = 0, buffers = 0;
  std::string worst_grad, worst_param, worst_buffer;
};

// Trains run.make_model() with SGD under DDP over `pg`, this rank taking its slice of each step's
// global batch, and a reference copy on run.reference_device with the whole batch; after every
// backward compares the gradients, after every step the parameters and buffers (running statistics,
// num_batches_tracked).
//
// The loss: DDP averages the ranks' gradients (1/W), while the reference's cross-entropy averages
// over the G = sum(sizes) samples. With unequal batches a per-rank mean would weigh a sample of a
// small batch more, so each rank takes the sum of its losses scaled by W / G: (1/W) sum over ranks
// of (W/G) sum_i l_i = the reference's mean. SyncBatchNorm's backward gives each rank the gradient
// of the sum of every rank's loss, which makes the average exact.
inline SyncBnDiffs sync_bn_vs_single_process(const SyncBnRun& run,
                                             const std::shared_ptr<dist::ProcessGroup>& pg) {
  const int world = pg->size(), rank = pg->rank();
  RG_CHECK(int(run.sizes.size()) == world, "sizes for ", run.sizes.size(), " ranks, world ", world);
  const int64_t global = std::accumulate(run.sizes.begin(), run.sizes.end(), int64_t(0));
  const int64_t first = std::accumulate(run.sizes.begin(), run.sizes.begin() + rank, int64_t(0));
  const int64_t mine = run.sizes[size_t(rank)];
  RG_CHECK(mine > 0, "every rank needs a sample here (the module test covers empty batches)");
  data::SyntheticDataset data(global * run.steps, run.sample_shape, 10, 17);
  const auto batch = [&](int64_t from, int64_t count, DType dtype, Device device) {
    std::vector<int64_t> idx(static_cast<size_t>(count));
    std::iota(idx.begin(), idx.end(), from);
    data::Batch b = data.get_batch(idx, 0);
    b.inputs = b.inputs.to(dtype).to(device);
    b.targets = b.targets.to(device);
    return b;
  };

  auto ref = run.make_model();
  auto model = run.make_model();
  ref->to(run.dtype);
  ref->to(run.reference_device);
  model->to(run.dtype);
  model->to(run.device);
  if (run.convert) {
    RG_CHECK(dist::convert_sync_batchnorm(*model, pg) > 0, "the model has no batch norm");
  }
  dist::DistributedDataParallel ddp(model, pg, {});
  const optim::SgdOptions sgd{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4};
  optim::Sgd ref_opt(ref->parameters(), sgd);
  optim::Sgd opt(model->parameters(), sgd);
  SyncBnDiffs d;
  const auto track = [](double v, const std::string& name, double& worst, std::string& at) {
    if (v >= worst) {
      worst = v;
      at = name;
    }
  };
  for (int step = 0; step < run.steps; ++step) {
    const data::Batch all = batch(step * global, global, run.dtype, run.reference_device);
    ref_opt.zero_grad();
    cross_entropy(ref->forward(all.inputs), all.targets).backward();

    const data::Batch part = batch(step * global + first, mine, run.dtype, run.device);
    opt.zero_grad();
    // cross_entropy's mean times mine: the sum of this rank's losses.
    const double scale = double(mine) * double(world) / double(global);
    (cross_entropy(ddp(part.inputs), part.targets) * scale).backward();
    std::string at;
    const double g = max_relative_difference(named_gradients(*model), named_gradients(*ref), &at);
    track(g, "step " + std::to_string(step) + " " + at, d.grads, d.worst_grad);

    ref_opt.step();
    opt.step();
    at.clear();
    const double p =
        max_relative_difference(model->named_parameters(), ref->named_parameters(), &at);
    track(p, "step " + std::to_string(step) + " " + at, d.params, d.worst_param);
    at.clear();
    const double b = max_relative_difference(model->named_buffers(), ref->named_buffers(), &at);
    track(b, "step " + std::to_string(step) + " " + at, d.buffers, d.worst_buffer);
  }
  return d;
}

// Expects every difference of `d` within `tolerance`, naming the worst tensors; rank 0 prints the
// figures (the measured values the tests' comments quote).
inline void expect_within(const SyncBnDiffs& d, double tolerance, const std::string& what,
                          int rank) {
  EXPECT_LE(d.grads, tolerance) << what << ": gradients, worst " << d.worst_grad;
  EXPECT_LE(d.params, tolerance) << what << ": parameters, worst " << d.worst_param;
  EXPECT_LE(d.buffers, tolerance) << what << ": buffers, worst " << d.worst_buffer;
  if (rank == 0) {
    std::cout << what << ": gradients " << d.grads << ", parameters " << d.params << ", buffers "
              << d.buffers << "\n";
  }
}

// Per-rank batches 3, 5, 7, ...: unequal, as an epoch's last batch can make them.
inline std::vector<int64_t> unequal_batch_sizes(int world) {
  std::vector<int64_t> s;
  for (int r = 0; r < world; ++r) s.push_back(3 + 2 * r);
  return s;
}

// Counts the collectives it passes on (eval mode must issue none).
class CountingCollectives final : public BatchNormCollectives {
 public:
  explicit CountingCollectives(std::shared_ptr<dist::ProcessGroup> g) : inner_(std::move(g)) {}
  int size() const override { return inner_.size(); }
  Tensor all_gather(const Tensor& local) override {
    ++calls;
    return inner_.all_gather(local);
  }
  void all_reduce_sum(const Tensor& t) override {
    ++calls;
    inner_.all_reduce_sum(t);
  }
  int calls = 0;

 private:
  dist::ProcessGroupBatchNormCollectives inner_;
};

// One SyncBatchNorm layer on `device` over `pg` (f64), batch sizes `sizes` (rank r's block of the
// global batch), [N, C, H, W] or [N, C]: two training steps then eval, against the batch_norm op
// on the whole batch on the CPU: outputs, input gradients, the weight and bias gradients summed
// over ranks, running statistics; eval mode issues no collective.
inline void check_sync_layer(const std::shared_ptr<dist::ProcessGroup>& pg, Device device,
                             const std::vector<int64_t>& sizes, bool image, const std::string& what,
                             double tolerance) {
  SCOPED_TRACE(what);
  const int rank = pg->rank();
  const int64_t c = 5;
  const int64_t global = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
  const int64_t first = std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t(0));
  const int64_t mine = sizes[size_t(rank)];
  const Shape shape = image ? Shape{global, c, 3, 2} : Shape{global, c};
  Generator gen(29);  // the same numbers on every rank

  auto counting = std::make_shared<CountingCollectives>(pg);
  auto layer = std::make_shared<nn::SyncBatchNorm>(c, 1e-5, 0.1, counting);
  EXPECT_EQ(layer->type_name(), "SyncBatchNorm");
  Tensor w = randn({c}, gen, DType::f64), b = randn({c}, gen, DType::f64);
  layer->to(DType::f64);
  layer->to(device);
  {
    NoGradGuard no_grad;
    Tensor(layer->weight).copy_(w);
    Tensor(layer->bias).copy_(b);
  }
  Tensor ref_w = w.clone().set_requires_grad(true), ref_b = b.clone().set_requires_grad(true);
  Tensor ref_mean = zeros({c}, DType::f64), ref_var = ones({c}, DType::f64);

  for (int step = 0; step < 2; ++step) {
    const Tensor x = randn(shape, gen, DType::f64) * 3.0 + 1.5;
    const Tensor gy = randn(shape, gen, DType::f64);
    Tensor ref_x = x.clone().set_requires_grad(true);
    const Tensor ref_y = batch_norm(ref_x, ref_mean, ref_var, ref_w, ref_b, true, 0.1, 1e-5);
    ref_w.zero_grad();
    ref_b.zero_grad();
    sum(ref_y * gy).backward();

    Tensor my_x = x.narrow(0, first, mine).to(device).set_requires_grad(true);
    layer->zero_grad();
    const Tensor y = layer->forward(my_x);
    sum(y * gy.narrow(0, first, mine).to(device)).backward();
    if (mine > 0) {
      EXPECT_LE(max_relative_difference({{"y", y}}, {{"y", ref_y.narrow(0, first, mine)}}),
                tolerance);
      EXPECT_LE(max_relative_difference({{"dx", my_x.grad()}},
                                        {{"dx", ref_x.grad().narrow(0, first, mine)}}),
                tolerance);
    }
    // The weight and bias gradients are this rank's share: their sum over ranks is the
    // reference's (DDP averages them, with the loss scaled as in sync_batch_norm_checks.h).
    const Tensor dw = dist::on_group_device(*pg, layer->weight.grad()).clone();
    const Tensor db = dist::on_group_device(*pg, layer->bias.grad()).clone();
    pg->all_reduce(dw)->wait();
    pg->all_reduce(db)->wait();
    EXPECT_LE(max_relative_difference({{"dw", dw}, {"db", db}},
                                      {{"dw", ref_w.grad()}, {"db", ref_b.grad()}}),
              tolerance);
    EXPECT_LE(max_relative_difference(
                  {{"running_mean", layer->running_mean}, {"running_var", layer->running_var}},
                  {{"running_mean", ref_mean}, {"running_var", ref_var}}),
              tolerance);
  }
  EXPECT_EQ(layer->num_batches_tracked.item(), 2);

  // Eval: batch norm with the running statistics, no collective.
  const int calls = counting->calls;
  layer->eval();
  const Tensor x = randn(image ? Shape{3, c, 3, 2} : Shape{3, c}, gen, DType::f64);
  const Tensor y = layer->forward(x.to(device));
  NoGradGuard no_grad;
  const Tensor expected = batch_norm(x, ref_mean, ref_var, w, b, false, 0.1, 1e-5);
  EXPECT_LE(max_relative_difference({{"y", y}}, {{"y", expected}}), tolerance);
  EXPECT_EQ(counting->calls, calls);
}

}  // namespace rg::testing
