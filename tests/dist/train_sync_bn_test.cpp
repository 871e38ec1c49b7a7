// ringgrad-train's --sync-bn end to end (label dist, 2 ranks under ringgrad-run; one test runs as a
// single process too): ResNet-18 on a small CIFAR-10 set trains with every batch norm
// synchronized, checkpoints under the unchanged names, and a model without batch norm or a single
// process says what --sync-bn did.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>

#include "apps/common/trainer.h"
#include "comm/env.h"
#include "layers/checkpoint.h"
#include "layers/models/registry.h"
#include "support/cifar_files.h"
#include "support/errors.h"
#include "support/scratch_dir.h"

namespace rg::app {
namespace {

class TrainSyncBn : public testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    // 5 x 4 = 20 samples: 3 steps of 4 per rank on 2 ranks, the last one with 2 per rank.
    testing::write_small_cifar10(dir_, 4, 16, 3);
  }
  TrainConfig config(const std::string& model) const {
    TrainConfig c;
    c.model = model;
    c.dataset = "cifar10";
    c.data_dir = dir_.string();
    c.epochs = 1;
    c.batch_size = 4;
    c.test_batch_size = 16;
    c.workers = 1;
    c.lr = 0.05;
    c.sync_bn = true;
    return c;
  }
  static int world() { return dist::read_launch_env().world_size; }
};

TEST_F(TrainSyncBn, ResNet18TrainsWithSynchronizedBatchNorm) {
  if (world() != 2) GTEST_SKIP() << "runs under ringgrad-run --nproc-per-node 2";
  TrainConfig c = config("resnet18");
  // Every rank writes its own scratch directory; rank 0 saves the checkpoint there.
  c.checkpoint_path = (dir_ / "model.safetensors").string();
  std::ostringstream out;
  const TrainResult r = train(c, out);
  EXPECT_EQ(r.total_steps, 3);
  ASSERT_EQ(r.epochs.size(), 1u);
  EXPECT_TRUE(std::isfinite(r.epochs[0].train_loss));
  if (dist::read_launch_env().rank == 0) {
    EXPECT_NE(out.str().find("--sync-bn: 20 batch norm layers synchronized over 2 ranks"),
              std::string::npos)
        << out.str();
    // The checkpoint keeps BatchNorm2d's names: it loads into a model without --sync-bn, with
    // the running statistics the run left (no longer the initial zeros).
    auto plain = nn::make_model(
        {.name = "resnet18", .sample_shape = {3, 32, 32}, .num_classes = 10, .seed = 9});
    nn::load_checkpoint(c.checkpoint_path, *plain, nullptr, nullptr);
    for (const auto& [name, t] : plain->named_buffers()) {
      if (name == "layer1.0.bn1.running_mean") {
        EXPECT_NE(t.to_vector<float>()[0], 0.0f);
      }
      if (name == "layer1.0.bn1.num_batches_tracked") {
        EXPECT_EQ(t.item(), 3);
      }
    }
  }
}

TEST_F(TrainSyncBn, AModelWithoutBatchNormIsLeftAloneWithAWarning) {
  if (world() != 2) GTEST_SKIP() << "runs under ringgrad-run --nproc-per-node 2";
  std::ostringstream out;
  const TrainResult r = train(config("mlp"), out);
  EXPECT_EQ(r.total_steps, 3);
  if (dist::read_launch_env().rank == 0) {
    EXPECT_NE(out.str().find("warning: --sync-bn: model mlp has no batch norm"), std::string::npos)
        << out.str();
  }
}

TEST_F(TrainSyncBn, OneProcessIsPlainBatchNorm) {
  if (world() != 1) GTEST_SKIP() << "runs as a single process";
  std::ostringstream out;
  TrainConfig c = config("resnet18");
  c.max_steps = 1;
  const TrainResult r = train(c, out);
  EXPECT_EQ(r.total_steps, 1);
  EXPECT_NE(out.str().find("--sync-bn with one process: plain batch norm"), std::string::npos)
      << out.str();
}

// --sync-bn is part of the run's shape: a checkpoint of a --sync-bn run does not resume without it.
TEST_F(TrainSyncBn, ResumingWithoutSyncBnIsRefused) {
  if (world() != 1) GTEST_SKIP() << "runs as a single process";
  std::ostringstream out;
  TrainConfig c = config("resnet18");
  c.epochs = 2;
  c.max_steps = 5;  // the first epoch (20 samples in batches of 4), checkpointed
  c.checkpoint_path = (dir_ / "model.safetensors").string();
  train(c, out);
  c.resume_path = c.checkpoint_path;
  c.max_steps = -1;
  c.sync_bn = false;
  testing::expect_error([&] { train(c, out); },
                        "the checkpoint's sync_bn is '1', this run's is '0'");
}

// Writes the small CIFAR-10 set into $RG_SYNC_BN_CIFAR_DIR for the ringgrad-train binary's test
// (e2e.train_sync_bn.np2, whose ctest fixture this is).
TEST(TrainSyncBnFixture, WritesTheSmallCifarSet) {
  const char* dir = std::getenv("RG_SYNC_BN_CIFAR_DIR");
  if (dir == nullptr) GTEST_SKIP() << "RG_SYNC_BN_CIFAR_DIR is not set";
  testing::write_small_cifar10(dir, 4, 16, 3);
}

}  // namespace
}  // namespace rg::app
