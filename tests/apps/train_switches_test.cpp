// ringgrad-train's --loss, --clip-grad-norm/--clip-grad-value and early stopping, through the
// training loop on small MNIST-format files: regression losses train, clipping acts (and a bound
// above the norm changes nothing), early stopping stops after exactly patience + 1 evaluations
// when nothing improves, keeps the best epoch's weights beside the last checkpoint, and resumes
// its count; bad flag values and combinations are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>

#include "apps/common/trainer.h"
#include "engine/serialization.h"
#include "support/errors.h"
#include "support/idx_files.h"
#include "support/scratch_dir.h"

namespace rg::app {
namespace {

class TrainSwitches : public testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    testing::write_small_mnist(dir_, 192, 64, 3);
  }
  TrainConfig config(int epochs, double lr) const {
    TrainConfig c;
    c.model = "mlp";
    c.dataset = "mnist";
    c.data_dir = dir_.string();
    c.epochs = epochs;
    c.batch_size = 32;  // 6 steps per epoch
    c.test_batch_size = 64;
    c.lr = lr;
    c.momentum = 0.9;
    c.seed = 7;
    c.workers = 0;
    return c;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
};

// The model.* tensors of two checkpoints are bitwise equal.
void expect_same_weights(const std::string& a, const std::string& b) {
  const SafetensorsFile fa = load_safetensors(a), fb = load_safetensors(b);
  ASSERT_EQ(fa.tensors.size(), fb.tensors.size());
  int compared = 0;
  for (size_t i = 0; i < fa.tensors.size(); ++i) {
    const auto& [name, ta] = fa.tensors[i];
    if (name.rfind("model.", 0) != 0) continue;
    const Tensor& tb = fb.tensors[i].second;
    ASSERT_EQ(name, fb.tensors[i].first);
    ASSERT_EQ(ta.nbytes(), tb.nbytes()) << name;
    EXPECT_EQ(std::memcmp(ta.raw_data(), tb.raw_data(), ta.nbytes()), 0) << name << " differs";
    ++compared;
  }
  EXPECT_GT(compared, 0);
}

TEST_F(TrainSwitches, RegressionLossesOnOneHotTargetsReduceTheLoss) {
  for (const std::string loss : {"mse", "smooth-l1"}) {
    SCOPED_TRACE(loss);
    std::ostringstream log;
    TrainConfig c = config(4, 0.05);
    c.loss = loss;
    const TrainResult r = train(c, log);
    ASSERT_EQ(r.epochs.size(), 4u);
    EXPECT_LT(r.epochs.back().train_loss, 0.9 * r.epochs.front().train_loss) << log.str();
    // The training loss is the regression loss: far below cross-entropy's ln(10) at the start.
    EXPECT_LT(r.epochs.front().train_loss, 1.0);
  }
}

// On the synthetic dataset (no files): 150 steps of mse training end with a lower training loss
// than the same steps at lr 0, i.e. than the untrained model's loss on the same batches.
TEST(TrainLoss, MseOnTheSyntheticDatasetReducesTheLoss) {
  const auto run = [](double lr) {
    TrainConfig c;
    c.model = "mlp";
    c.dataset = "synthetic";
    c.loss = "mse";
    c.lr = lr;
    c.max_steps = 150;
    c.workers = 0;
    std::ostringstream log;
    return train(c, log).epochs.at(0).train_loss;
  };
  const double untrained = run(0.0), trained = run(0.1);
  EXPECT_LT(trained, 0.95 * untrained) << "trained " << trained << ", untrained " << untrained;
}

TEST_F(TrainSwitches, ClippingAGradientNormAboveTheBoundChangesTheRun) {
  std::ostringstream log;
  const TrainResult plain = train(config(1, 0.05), log);
  TrainConfig loose = config(1, 0.05);
  loose.clip_grad_norm = 1e9;  // coefficient clamped to 1: bit for bit the plain run
  EXPECT_EQ(train(loose, log).final_test_loss, plain.final_test_loss);
  TrainConfig tight = config(1, 0.05);
  tight.clip_grad_norm = 0.01;
  const TrainResult clipped = train(tight, log);
  EXPECT_NE(clipped.final_test_loss, plain.final_test_loss);
  TrainConfig by_value = config(1, 0.05);
  by_value.clip_grad_value = 1e-4;
  const TrainResult clamped = train(by_value, log);
  EXPECT_NE(clamped.final_test_loss, plain.final_test_loss);
  EXPECT_NE(clamped.final_test_loss, clipped.final_test_loss);
}

// Under --amp f16 the gradients are loss-scaled (65536 at first): the clip must see them unscaled.
// A bound of 100 is far above the true norms and far below the scaled ones, so a clip of the
// unscaled gradients changes nothing (bit for bit the run without clipping) while a clip of the
// scaled ones would shrink every step.
TEST_F(TrainSwitches, UnderAmpF16TheClipSeesTheUnscaledGradients) {
  std::ostringstream log;
  TrainConfig plain = config(1, 0.05);
  plain.amp = "f16";
  const TrainResult a = train(plain, log);
  TrainConfig clipped = plain;
  clipped.clip_grad_norm = 100;
  EXPECT_EQ(train(clipped, log).final_test_loss, a.final_test_loss) << log.str();
  clipped.clip_grad_norm = 0.01;  // and a bound below the true norms does clip
  EXPECT_NE(train(clipped, log).final_test_loss, a.final_test_loss);
}

TEST_F(TrainSwitches, EarlyStoppingWithoutImprovementStopsAfterPatiencePlusOneEpochs) {
  for (const std::string metric : {"loss", "top1"}) {
    SCOPED_TRACE(metric);
    std::ostringstream log;
    TrainConfig c = config(10, 0.0);  // lr 0: every evaluation gives the same metric
    c.early_stop_patience = 2;
    c.early_stop_metric = metric;
    c.checkpoint_path = path("run-" + metric + ".safetensors");
    const TrainResult r = train(c, log);
    EXPECT_EQ(r.epochs.size(), 3u) << log.str();  // best at 1, no improvement at 2 and 3
    EXPECT_TRUE(r.stopped_early);
    EXPECT_EQ(r.best_epoch, 1);
    EXPECT_EQ(r.best_metric, metric == "top1" ? r.epochs[0].top1 : r.epochs[0].test_loss);
    EXPECT_NE(log.str().find("stopped early after epoch 3"), std::string::npos) << log.str();
    EXPECT_NE(log.str().find("\"stopped_early\":true"), std::string::npos) << log.str();
    EXPECT_NE(log.str().find("\"best_epoch\":1"), std::string::npos) << log.str();
    const std::string best = path("run-" + metric + ".best.safetensors");
    ASSERT_TRUE(std::filesystem::exists(best));
    const SafetensorsFile f = load_safetensors(best);
    EXPECT_EQ(f.metadata.at("epoch"), "1");
    EXPECT_EQ(f.metadata.at("early_stop.metric"), metric);
    EXPECT_EQ(f.metadata.at("early_stop.best_epoch"), "1");
    EXPECT_EQ(load_safetensors(c.checkpoint_path).metadata.at("epoch"), "3");
  }
}

TEST_F(TrainSwitches, TheBestCheckpointHoldsTheBestEpochsWeights) {
  std::ostringstream log;
  TrainConfig c = config(8, 0.5);  // a high rate: the test loss goes down, then up
  c.early_stop_patience = 1;
  c.checkpoint_path = path("run.safetensors");
  const TrainResult r = train(c, log);
  // The best epoch by the rule: the first strict minimum of the test loss so far.
  int best = 0;
  double best_loss = 0;
  for (const EpochSummary& s : r.epochs) {
    if (best == 0 || s.test_loss < best_loss) {
      best = s.epoch;
      best_loss = s.test_loss;
    }
  }
  EXPECT_EQ(r.best_epoch, best) << log.str();
  // With this rate the loss rises again after the best epoch (else the test would prove little).
  EXPECT_TRUE(r.stopped_early) << log.str();
  EXPECT_LT(r.best_epoch, r.epochs.back().epoch);
  EXPECT_EQ(r.best_metric, best_loss);
  // The same run (constant LR: epochs do not change the schedule) stopped at that epoch.
  TrainConfig until_best = config(best, 0.5);
  until_best.checkpoint_path = path("until-best.safetensors");
  train(until_best, log);
  expect_same_weights(path("run.best.safetensors"), until_best.checkpoint_path);
  EXPECT_EQ(load_safetensors(path("run.best.safetensors")).metadata.at("epoch"),
            std::to_string(best));
}

TEST_F(TrainSwitches, ResumingKeepsTheEarlyStoppingCount) {
  std::ostringstream log;
  TrainConfig first = config(10, 0.0);
  first.early_stop_patience = 2;
  first.max_steps = 12;  // two epochs: best at 1, one evaluation without improvement
  first.checkpoint_path = path("first.safetensors");
  train(first, log);
  TrainConfig rest = config(10, 0.0);
  rest.early_stop_patience = 2;
  rest.resume_path = first.checkpoint_path;
  const TrainResult r = train(rest, log);
  ASSERT_EQ(r.epochs.size(), 1u) << log.str();  // epoch 3 is the second without improvement
  EXPECT_EQ(r.epochs[0].epoch, 3);
  EXPECT_TRUE(r.stopped_early);
  EXPECT_EQ(r.best_epoch, 1);
}

TEST_F(TrainSwitches, BadValuesAndCombinationsAreClearErrors) {
  const auto error = [&](const std::function<void(TrainConfig&)>& change) {
    TrainConfig c = config(1, 0.05);
    change(c);
    std::ostringstream log;
    const std::string from_train = testing::error_of([&] { train(c, log); });
    EXPECT_EQ(from_train, config_error(c));
    return config_error(c);
  };
  EXPECT_EQ(config_error(config(1, 0.05)), "");
  EXPECT_NE(
      error([](TrainConfig& c) { c.clip_grad_norm = -1; }).find("--clip-grad-norm must be >= 0"),
      std::string::npos);
  EXPECT_NE(error([](TrainConfig& c) { c.clip_grad_norm = NAN; }).find("got nan"),
            std::string::npos);
  EXPECT_NE(error([](TrainConfig& c) { c.clip_grad_value = -0.5; }).find("--clip-grad-value"),
            std::string::npos);
  EXPECT_NE(error([](TrainConfig& c) {
              c.clip_grad_norm = 1;
              c.clip_grad_value = 1;
            }).find("cannot be combined"),
            std::string::npos);
  EXPECT_NE(error([](TrainConfig& c) { c.loss = "hinge"; }).find("--loss must be"),
            std::string::npos);
  EXPECT_NE(error([](TrainConfig& c) {
              c.loss = "mse";
              c.label_smoothing = 0.1;
            }).find("--label-smoothing applies to --loss cross-entropy only"),
            std::string::npos);
  EXPECT_NE(error([](TrainConfig& c) { c.early_stop_patience = -1; }).find("patience must be >= 0"),
            std::string::npos);
  EXPECT_NE(error([](TrainConfig& c) { c.early_stop_metric = "top5"; }).find("loss or top1"),
            std::string::npos);
  EXPECT_NE(error([](TrainConfig& c) {
              c.early_stop_patience = 1;
              c.eval_every = 0;
            }).find("--eval-every must be 1"),
            std::string::npos);
}

TEST(BestCheckpointPath, InsertsBestBeforeTheExtension) {
  EXPECT_EQ(best_checkpoint_path("run.safetensors"), "run.best.safetensors");
  EXPECT_EQ(best_checkpoint_path("/a.b/run.safetensors"), "/a.b/run.best.safetensors");
  EXPECT_EQ(best_checkpoint_path("/a.b/run"), "/a.b/run.best");
  EXPECT_EQ(best_checkpoint_path("run"), "run.best");
  EXPECT_EQ(best_checkpoint_path("dir/.hidden"), "dir/.hidden.best");
}

}  // namespace
}  // namespace rg::app
