// SyncBatchNorm on emulated CUDA devices over the emulated NCCL (labels emu and dist, started by
// ringgrad-run with RG_TEST_BACKEND=nccl, one device per rank process, under the race detector):
// DDP with SyncBatchNorm on the device against one CPU process in f64 with the whole batch and
// plain batch norm, step after step, equal and unequal per-rank batches. f64 on the device is the
// exact check of the device path (our kernels, the gathered statistics, the all-reduced sums); f32
// is held to a tight tolerance. A small conv net (two conv + batch norm stages): ResNet-18 takes
// minutes per step under the emulator.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>

#include "comm/init.h"
#include "layers/activation.h"
#include "layers/batch_norm.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
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

// f64: rounding only (~1e-15 measured). f32 against the f64 reference: the f32 rounding of
// activations normalized by the statistics, ~1e-6 measured; a wrong count or a missing
// all-reduce is off by more than 1e-2.
constexpr double kF64Tolerance = 1e-10;
constexpr double kF32Tolerance = 1e-4;

std::shared_ptr<nn::Module> small_net() {
  Generator gen(7);
  const nn::Conv2dOptions same{.padding = {1, 1}};
  const nn::Conv2dOptions down{.stride = {2, 2}, .padding = {1, 1}};
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

void check(DType dtype, std::vector<int64_t> sizes, const std::string& what) {
  testing::SyncBnRun run;
  run.make_model = small_net;
  run.sample_shape = {3, 8, 8};
  run.sizes = std::move(sizes);
  run.steps = 3;
  run.dtype = dtype;
  run.device = Device::cuda(0);
  const testing::SyncBnDiffs d = testing::sync_bn_vs_single_process(run, default_group());
  const double tol = dtype == DType::f64 ? kF64Tolerance : kF32Tolerance;
  EXPECT_LE(d.grads, tol) << what << ": gradients, worst " << d.worst_grad;
  EXPECT_LE(d.params, tol) << what << ": parameters, worst " << d.worst_param;
  EXPECT_LE(d.buffers, tol) << what << ": buffers, worst " << d.worst_buffer;
  if (default_group()->rank() == 0) {
    std::cout << what << ": gradients " << d.grads << ", parameters " << d.params << ", buffers "
              << d.buffers << "\n";
  }
}

TEST(SyncBatchNormOnDevice, MatchesOneCpuProcessWithTheWholeBatch) {
  ASSERT_STREQ(default_group()->backend(), "nccl");
  const int world = default_group()->size();
  std::vector<int64_t> equal(size_t(world), 4), unequal;
  for (int r = 0; r < world; ++r) unequal.push_back(3 + 2 * r);
  for (DType dtype : {DType::f64, DType::f32}) {
    check(dtype, equal, std::string(dtype_name(dtype)) + " equal batches");
    check(dtype, unequal, std::string(dtype_name(dtype)) + " unequal batches");
  }
}

}  // namespace
}  // namespace rg::dist
