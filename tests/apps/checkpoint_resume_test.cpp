// ringgrad-train's checkpoints: a run stopped after an epoch and resumed reproduces the
// uninterrupted run bit for bit (weights, optimizer state, dropout RNG, test metrics), for SGD
// with momentum and for AdamW; a resume whose run shape differs is refused with the reason.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>

#include "apps/common/trainer.h"
#include "engine/serialization.h"
#include "support/errors.h"
#include "support/idx_files.h"
#include "support/scratch_dir.h"

namespace rg::app {
namespace {

class CheckpointResume : public testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    testing::write_small_mnist(dir_, 192, 64, 1);
  }
  TrainConfig config(const std::string& optimizer, int epochs) const {
    TrainConfig c;
    c.model = "toynet";  // with dropout: its generator must be restored too
    c.dataset = "mnist";
    c.data_dir = dir_.string();
    c.epochs = epochs;
    c.batch_size = 32;
    c.test_batch_size = 64;
    c.optimizer = optimizer;
    c.lr = optimizer == "sgd" ? 0.05 : 1e-3;
    c.momentum = 0.9;
    c.weight_decay = optimizer == "sgd" ? 0.0 : 0.01;
    c.lr_schedule = "cosine";  // the learning rate depends on the global step
    c.seed = 5;
    return c;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
};

void expect_same_files(const std::string& a, const std::string& b) {
  const SafetensorsFile fa = load_safetensors(a), fb = load_safetensors(b);
  ASSERT_EQ(fa.tensors.size(), fb.tensors.size());
  for (size_t i = 0; i < fa.tensors.size(); ++i) {
    const auto& [name, ta] = fa.tensors[i];
    const Tensor& tb = fb.tensors[i].second;
    EXPECT_EQ(name, fb.tensors[i].first);
    ASSERT_EQ(ta.nbytes(), tb.nbytes()) << name;
    EXPECT_EQ(std::memcmp(ta.raw_data(), tb.raw_data(), ta.nbytes()), 0) << name << " differs";
  }
  EXPECT_EQ(fa.metadata, fb.metadata);
}

TEST_F(CheckpointResume, ResumingAfterAnEpochReproducesTheUninterruptedRun) {
  // With --amp f16 the GradScaler's scale and growth tracker are part of the state too.
  for (const auto& [opt, amp] : std::vector<std::pair<std::string, std::string>>{
           {"sgd", "off"}, {"adamw", "off"}, {"sgd", "f16"}, {"adamw", "bf16"}}) {
    SCOPED_TRACE(opt + " amp " + amp);
    std::ostringstream log;
    const auto config = [this, amp](const std::string& o, int epochs) {
      TrainConfig c = CheckpointResume::config(o, epochs);
      c.amp = amp;
      return c;
    };
    TrainConfig whole = config(opt, 3);
    whole.checkpoint_path = path("whole.safetensors");
    const TrainResult a = train(whole, log);

    // The same command stopped after its first epoch (as a crash would), then resumed.
    TrainConfig first = config(opt, 3);
    first.max_steps = 6;  // one epoch of 192 / 32
    first.checkpoint_path = path("first.safetensors");
    train(first, log);
    TrainConfig rest = config(opt, 3);
    rest.resume_path = first.checkpoint_path;
    rest.checkpoint_path = path("rest.safetensors");
    const TrainResult c = train(rest, log);

    ASSERT_EQ(c.epochs.size(), 2u) << "epochs 2 and 3 only";
    EXPECT_EQ(c.epochs.front().epoch, 2);
    EXPECT_EQ(c.total_steps, a.total_steps);
    EXPECT_EQ(c.final_test_loss, a.final_test_loss) << log.str();
    EXPECT_EQ(c.epochs.back().train_loss, a.epochs.back().train_loss);
    expect_same_files(whole.checkpoint_path, rest.checkpoint_path);
    const SafetensorsFile saved = load_safetensors(whole.checkpoint_path);
    EXPECT_EQ(saved.metadata.count("scaler.scale"), amp == "f16" ? 1u : 0u);
    EXPECT_NE(log.str().find("resumed from " + first.checkpoint_path + " after epoch 1 (step 6)"),
              std::string::npos)
        << log.str();
  }
}

// --amp takes off, f16 or bf16 (the command line checks it too; the library says it as well).
TEST_F(CheckpointResume, AnUnknownAmpModeIsAClearError) {
  std::ostringstream log;
  TrainConfig c = config("sgd", 1);
  c.amp = "f32";
  EXPECT_NE(
      testing::error_of([&] { train(c, log); }).find("--amp must be off, f16 or bf16, got 'f32'"),
      std::string::npos);
}

// --resume and an existing --snapshot both say where to continue: refused, naming both.
TEST_F(CheckpointResume, ResumeAndAnExistingSnapshotAreRefused) {
  std::ostringstream log;
  TrainConfig first = config("sgd", 2);
  first.max_steps = 6;
  first.checkpoint_path = path("first.safetensors");
  first.snapshot_path = path("snap.safetensors");
  train(first, log);
  TrainConfig both = config("sgd", 2);
  both.resume_path = first.checkpoint_path;
  both.snapshot_path = first.snapshot_path;
  EXPECT_NE(
      testing::error_of([&] { train(both, log); }).find("both say where to continue; give one"),
      std::string::npos);
}

// A snapshot whose DDP bucket order is not a list of indices is a clear error naming the entry,
// not an exception from deep inside (found by the snapshot fuzzer: std::stoll threw).
TEST_F(CheckpointResume, ASnapshotWithABadBucketOrderIsACleanError) {
  std::ostringstream log;
  TrainConfig c = config("sgd", 2);
  c.max_steps = 3;  // mid-epoch
  c.snapshot_path = path("snap.safetensors");
  train(c, log);
  for (const std::string bad : {"0,x", "99999999999999999999", "1,-2"}) {
    SafetensorsFile f = load_safetensors(c.snapshot_path);
    f.metadata["snapshot.bucket_order"] = bad;
    f.metadata.erase("rg.crc32");  // save_safetensors writes it again
    save_safetensors(c.snapshot_path, f.tensors, f.metadata);
    TrainConfig again = config("sgd", 2);
    again.snapshot_path = c.snapshot_path;
    EXPECT_NE(testing::error_of([&] { train(again, log); }).find("not a bucket index"),
              std::string::npos)
        << bad;
  }
}

TEST_F(CheckpointResume, ADifferentRunOrNothingLeftToDoIsRefused) {
  std::ostringstream log;
  TrainConfig first = config("sgd", 2);
  first.max_steps = 6;
  first.checkpoint_path = path("first.safetensors");
  train(first, log);
  const auto refusal = [&](TrainConfig other) {
    other.resume_path = first.checkpoint_path;
    return testing::error_of([&] { train(other, log); });
  };
  TrainConfig other = config("sgd", 2);
  other.batch_size = 16;
  EXPECT_NE(refusal(other).find("the checkpoint's batch_size is '32', this run's is '16'"),
            std::string::npos);
  EXPECT_NE(refusal(config("adam", 2)).find("the checkpoint's optimizer is 'sgd lr=0.05"),
            std::string::npos);
  other = config("sgd", 2);
  other.amp = "bf16";
  EXPECT_NE(refusal(other).find("the checkpoint's amp is 'off', this run's is 'bf16'"),
            std::string::npos);
  // The buckets' flat state (PowerSGD's error feedback) lies as the parameters do.
  other = config("sgd", 2);
  other.channels_last = true;
  EXPECT_NE(refusal(other).find("the checkpoint's channels_last is '0', this run's is '1'"),
            std::string::npos);
  other = config("sgd", 2);
  other.lr_schedule = "constant";
  EXPECT_NE(refusal(other).find("the checkpoint's lr_schedule is 'cosine"), std::string::npos);
  other = config("sgd", 2);
  other.max_steps = 6;
  EXPECT_NE(refusal(other).find("--max-steps 6 is not beyond the checkpoint's step 6"),
            std::string::npos);
  other = config("sgd", 2);
  other.comm_hook = "powersgd";
  EXPECT_NE(refusal(other).find("not supported"), std::string::npos);

  TrainConfig done = config("sgd", 1);
  done.checkpoint_path = path("done.safetensors");
  train(done, log);
  other = config("sgd", 1);
  other.resume_path = done.checkpoint_path;
  EXPECT_NE(
      testing::error_of([&] { train(other, log); }).find("the run is complete (1 of 1 epochs)"),
      std::string::npos);
}

}  // namespace
}  // namespace rg::app
