// SyncBatchNorm on emulated CUDA devices over the emulated NCCL (labels emu and dist, started by
// ringgrad-run with RG_TEST_BACKEND=nccl, one device per rank process, under the race detector):
// DDP with SyncBatchNorm on the device against one CPU process in f64 with the whole batch and
// plain batch norm, step after step, equal and unequal per-rank batches. f64 on the device is the
// exact check of the device path (our kernels, the gathered statistics, the all-reduced sums); f32
// is held to a tight tolerance. A small conv net (two conv + batch norm stages) for 3 steps, and
// ResNet-18 (8x8 inputs) for 2 steps in f64 and 1 in f32; one layer over the NCCL group and over a
// gloo group (host copies).
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>

#include "comm/init.h"
#include "comm/prefix_store.h"
#include "engine/tf32.h"
#include "layers/activation.h"
#include "layers/batch_norm.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/models/registry.h"
#include "layers/pooling.h"
#include "layers/sequential.h"
#include "support/sync_batch_norm_checks.h"

namespace rg::dist {
namespace {

using namespace std::chrono_literals;

class DistEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    InitOptions o;
    o.backend = "nccl";
    o.group.timeout = 60s;
    init_process_group(o);
  }
  void TearDown() override { destroy_process_group(); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new DistEnvironment);

// f64 against the CPU: rounding only (~2e-15 measured for the small net, ~4e-14 for ResNet-18).
// f32 against the f32 model on the device: the order of sums only, ~8e-7 for the gradients and
// ~5e-7 for the parameters measured (small net); a wrong count or a missing all-reduce is off by
// more than 1e-2.
constexpr double kF64Tolerance = 1e-10;
constexpr double kF32Tolerance = 1e-5;

std::shared_ptr<nn::Module> small_net() {
  Generator gen(7);
  // No conv bias before batch norm (which cancels it), as in ResNet: its gradient is rounding
  // noise.
  const nn::Conv2dOptions same{.padding = {1, 1}, .bias = false};
  const nn::Conv2dOptions down{.stride = {2, 2}, .padding = {1, 1}, .bias = false};
  return std::make_shared<nn::Sequential>(nn::Sequential::NamedModules{
      {"conv1", std::make_shared<nn::Conv2d>(3, 8, std::array<int64_t, 2>{3, 3}, gen, same)},
      {"bn1", std::make_shared<nn::BatchNorm2d>(8)},
      {"relu1", std::make_shared<nn::ReLU>()},
      {"conv2", std::make_shared<nn::Conv2d>(8, 16, std::array<int64_t, 2>{3, 3}, gen, down)},
      {"bn2", std::make_shared<nn::BatchNorm2d>(16)},
      {"relu2", std::make_shared<nn::ReLU>()},
      {"pool", std::make_shared<nn::AdaptiveAvgPool2d>()},
      {"flatten", std::make_shared<nn::Flatten>()},
      {"fc", std::make_shared<nn::Linear>(16, 10, gen)},
  });
}

void check(DType dtype, std::vector<int64_t> sizes, const std::string& what,
           std::function<std::shared_ptr<nn::Module>()> make_model = small_net, int steps = 3,
           double f32_tolerance = kF32Tolerance) {
  testing::SyncBnRun run;
  run.make_model = std::move(make_model);
  run.sample_shape = {3, 8, 8};
  run.sizes = std::move(sizes);
  run.steps = steps;
  run.dtype = dtype;
  run.device = default_group()->tensor_device();
  // f64: against the CPU, the exact check of the device path. f32: against the same f32 model on
  // the device (plain batch norm there), so that only the order of sums differs.
  run.reference_device = dtype == DType::f64 ? Device::cpu() : run.device;
  // f32 is compared as f32: with TF32 convolutions a last-bit difference in a gradient can cross
  // a TF32 rounding boundary and grow layer by layer (0.4 relative in ResNet-18 after one step).
  const cuda::Tf32Guard full_f32(false, false);
  const testing::SyncBnDiffs d = testing::sync_bn_vs_single_process(run, default_group());
  const double tol = dtype == DType::f64 ? kF64Tolerance : f32_tolerance;
  testing::expect_within(d, tol, what, default_group()->rank());
}

TEST(SyncBatchNormOnDevice, MatchesOneCpuProcessWithTheWholeBatch) {
  ASSERT_STREQ(default_group()->backend(), "nccl");
  const int world = default_group()->size();
  const std::vector<int64_t> equal(size_t(world), 4);
  const std::vector<int64_t> unequal = testing::unequal_batch_sizes(world);
  for (DType dtype : {DType::f64, DType::f32}) {
    check(dtype, equal, std::string(dtype_name(dtype)) + " equal batches");
    check(dtype, unequal, std::string(dtype_name(dtype)) + " unequal batches");
  }
}

TEST(SyncBatchNormOnDevice, ResNet18MatchesOneCpuProcessWithTheWholeBatch) {
  const int world = default_group()->size();
  const std::vector<int64_t> unequal = testing::unequal_batch_sizes(world);
  const auto resnet = [] {
    return nn::make_model({.name = "resnet18",
                           .sample_shape = {3, 8, 8},
                           .num_classes = 10,
                           .seed = 5,
                           .dropout = false});
  };
  check(DType::f64, unequal, "resnet18 f64 unequal batches", resnet, 2);
  // One step in f32: ResNet-18 on 8x8 inputs normalizes layer4 over a few values per channel, and
  // two f32 runs that only sum in another order differ by ~1e-4 after one step and by ~10% (in a
  // small bias gradient) after two, on the CPU with equal batches too (measured): the f64 runs
  // above are the exact check. One step: 3.5e-5 (3 ranks) to 8.2e-5 (2 ranks) measured.
  check(DType::f32, unequal, "resnet18 f32 unequal batches, one step", resnet, 1, 3e-4);
}

// One layer on the device against batch_norm on the CPU with the whole batch, over the NCCL group
// (tensors on its device) and over a gloo group (ProcessGroupBatchNormCollectives copies the
// statistics and sums to the host and back), a rank with an empty batch included.
TEST(SyncBatchNormOnDevice, LayerMatchesBatchNormOnTheConcatenatedBatch) {
  const auto& nccl = default_group();
  const int world = nccl->size();
  ProcessGroupOptions options;
  options.name = "sync_batch_norm_gloo";
  const auto gloo = make_process_group(
      "gloo", std::make_shared<PrefixStore>("sync_batch_norm_gloo", default_store()), nccl->rank(),
      world, options);
  std::vector<int64_t> with_empty = testing::unequal_batch_sizes(world);
  with_empty[0] = 0;
  for (const auto& [name, group] : {std::pair{"nccl", nccl}, std::pair{"gloo", gloo}}) {
    const std::string g = name;
    testing::check_sync_layer(group, nccl->tensor_device(), testing::unequal_batch_sizes(world),
                              true, g + " unequal [N, C, H, W]", kF64Tolerance);
    testing::check_sync_layer(group, nccl->tensor_device(), with_empty, false,
                              g + " rank 0 empty [N, C]", kF64Tolerance);
  }
}

}  // namespace
}  // namespace rg::dist
