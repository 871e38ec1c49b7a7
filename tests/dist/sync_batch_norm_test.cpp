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

void check_layer(const std::vector<int64_t>& sizes, bool image, const std::string& what) {
  testing::check_sync_layer(default_group(), Device::cpu(), sizes, image, what, kTolerance);
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
