// SyncBatchNorm across real processes over gloo (label dist, started by ringgrad-run, 2 and 3
// ranks): ResNet-18 with SyncBatchNorm under DDP must match one process with the whole batch and
// plain batch norm, step after step, in f64 (gradients, parameters, running statistics), also with
// unequal per-rank batches; one SyncBatchNorm layer must give batch norm's outputs and input
// gradients on the concatenated batch (an empty batch on a rank included); eval mode is plain
// batch norm with the running statistics and communicates nothing.
#include "layers/sync_batch_norm.h"

#include <gtest/gtest.h>

#include <iostream>
#include <numeric>

#include "comm/init.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/batch_norm.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/reduce.h"
#include "layers/models/registry.h"
#include "support/sync_batch_norm_checks.h"

namespace rg::dist {
namespace {

// DDP and one process sum in a different order (and the global statistics are combined from
// per-rank ones), so in f64 they agree to rounding. Measured, worst over 3 steps: gradients
// 1.3e-12 (2 ranks) and 1.3e-13 (3 ranks), parameters 2.5e-13, buffers 3.3e-14. Leaving out the
// gradient all-reduce moves the gradients by ~2 (relative), local statistics (the unconverted
// control below) by more than 1e-3, the local count in the running variance's unbiasing the
// buffers by ~6e-2.
constexpr double kTolerance = 1e-10;

std::vector<int64_t> equal_sizes(int world) { return std::vector<int64_t>(size_t(world), 4); }
std::vector<int64_t> unequal_sizes(int world) { return testing::unequal_batch_sizes(world); }

testing::SyncBnRun resnet_run(std::vector<int64_t> sizes) {
  testing::SyncBnRun run;
  run.make_model = [] {
    return nn::make_model({.name = "resnet18",
                           .sample_shape = {3, 8, 8},
                           .num_classes = 10,
                           .seed = 5,
                           .dropout = false});
  };
  run.sample_shape = {3, 8, 8};
  run.sizes = std::move(sizes);
  run.steps = 3;
  return run;
}

void expect_equivalent(const testing::SyncBnDiffs& d, const std::string& what) {
  testing::expect_within(d, kTolerance, what, default_group()->rank());
}

TEST(SyncBatchNorm, ResNet18MatchesOneProcessWithTheWholeBatch) {
  const int world = default_group()->size();
  expect_equivalent(
      testing::sync_bn_vs_single_process(resnet_run(equal_sizes(world)), default_group()),
      "resnet18 f64 equal batches");
  expect_equivalent(
      testing::sync_bn_vs_single_process(resnet_run(unequal_sizes(world)), default_group()),
      "resnet18 f64 unequal batches");
}

// The control: the same run with plain batch norm (per-rank statistics) is far off, so the
// comparison above can fail.
TEST(SyncBatchNorm, PlainBatchNormUnderDdpDoesNotMatch) {
  testing::SyncBnRun run = resnet_run(unequal_sizes(default_group()->size()));
  run.convert = false;
  run.steps = 1;
  const testing::SyncBnDiffs d = testing::sync_bn_vs_single_process(run, default_group());
  EXPECT_GT(d.grads, 1e-3);
  EXPECT_GT(d.buffers, 1e-3);
}

// Counts the collectives it passes on (eval mode must issue none).
class CountingCollectives final : public BatchNormCollectives {
 public:
  explicit CountingCollectives(std::shared_ptr<ProcessGroup> g) : inner_(std::move(g)) {}
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
  ProcessGroupBatchNormCollectives inner_;
};

// One layer, batch sizes `sizes` (rank r's block of the global batch), [N, C, H, W] or [N, C]:
// two training steps then eval, against the batch_norm op on the whole batch.
void check_layer(const std::vector<int64_t>& sizes, bool image, const std::string& what) {
  SCOPED_TRACE(what);
  const auto& pg = default_group();
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

    Tensor my_x = x.narrow(0, first, mine).clone().set_requires_grad(true);
    layer->zero_grad();
    const Tensor y = layer->forward(my_x);
    sum(y * gy.narrow(0, first, mine)).backward();
    if (mine > 0) {
      EXPECT_LE(testing::max_relative_difference({{"y", y}}, {{"y", ref_y.narrow(0, first, mine)}}),
                kTolerance);
      EXPECT_LE(testing::max_relative_difference({{"dx", my_x.grad()}},
                                                 {{"dx", ref_x.grad().narrow(0, first, mine)}}),
                kTolerance);
    }
    // The weight and bias gradients are this rank's share: their sum over ranks is the
    // reference's (DDP averages them, with the loss scaled as in sync_batch_norm_checks.h).
    Tensor dw = layer->weight.grad().clone(), db = layer->bias.grad().clone();
    pg->all_reduce(dw)->wait();
    pg->all_reduce(db)->wait();
    EXPECT_LE(testing::max_relative_difference({{"dw", dw}, {"db", db}},
                                               {{"dw", ref_w.grad()}, {"db", ref_b.grad()}}),
              kTolerance);
    EXPECT_LE(testing::max_relative_difference(
                  {{"running_mean", layer->running_mean}, {"running_var", layer->running_var}},
                  {{"running_mean", ref_mean}, {"running_var", ref_var}}),
              kTolerance);
  }
  EXPECT_EQ(layer->num_batches_tracked.item(), 2);

  // Eval: batch norm with the running statistics, no collective.
  const int calls = counting->calls;
  layer->eval();
  const Tensor x = randn(image ? Shape{3, c, 3, 2} : Shape{3, c}, gen, DType::f64);
  const Tensor y = layer->forward(x);
  NoGradGuard no_grad;
  const Tensor expected = batch_norm(x, ref_mean, ref_var, w, b, false, 0.1, 1e-5);
  EXPECT_LE(testing::max_relative_difference({{"y", y}}, {{"y", expected}}), kTolerance);
  EXPECT_EQ(counting->calls, calls);
}

TEST(SyncBatchNorm, LayerMatchesBatchNormOnTheConcatenatedBatch) {
  const int world = default_group()->size();
  check_layer(equal_sizes(world), true, "equal [N, C, H, W]");
  check_layer(unequal_sizes(world), true, "unequal [N, C, H, W]");
  check_layer(unequal_sizes(world), false, "unequal [N, C]");
  std::vector<int64_t> with_empty = unequal_sizes(world);
  with_empty[0] = 0;  // PyTorch's case: a rank whose batch is empty still joins the collectives
  check_layer(with_empty, true, "rank 0 empty");
}

TEST(SyncBatchNorm, DefaultCollectivesAreTheDefaultGroup) {
  // convert_sync_batchnorm without collectives: init_process_group's group, as PyTorch's WORLD.
  ASSERT_NE(nn::default_batch_norm_collectives(), nullptr);
  EXPECT_EQ(nn::default_batch_norm_collectives()->size(), default_group()->size());
}

}  // namespace
}  // namespace rg::dist
