// Snapshots and restarts end to end: ringgrad-run --max-restarts over ringgrad-train --snapshot,
// one rank killed with SIGKILL (RG_TEST_FAULT, the trainer's fault injection for these tests) at
// a random optimizer step, during an evaluation or just before a snapshot is written; the job
// resumes from the last snapshot and ends with a final snapshot (weights, optimizer, RNG, ...)
// identical byte for byte to the uninterrupted run's, at 2 and 4 ranks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/idx_files.h"
#include "support/processes.h"
#include "support/restart_checks.h"
#include "support/scratch_dir.h"

namespace rg {
namespace {

namespace fs = std::filesystem;

class SnapshotRestart : public testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    fs::create_directories(dir_ / "mnist");
    testing::write_small_mnist(dir_ / "mnist", 192, 64, 1);
  }

  // ToyNet (dropout: its RNG must be restored too) for 3 epochs of 6 steps (192 samples over
  // `ranks` ranks), a snapshot every 4 steps, under `nodes` ringgrad-run launchers on this
  // machine (--nnodes, --node-rank); with `fault` one rank is killed once and the launchers
  // restart the job. Returns each launcher's output; the final snapshot is `snapshot`.
  std::vector<testing::ProcessResult> run_nodes(int ranks, int nodes, const std::string& snapshot,
                                                const std::string& fault, int max_restarts = 1) {
    const std::string port = nodes > 1 ? std::to_string(testing::free_port()) : "0";
    std::vector<testing::ProcessSpec> specs;
    for (int node = 0; node < nodes; ++node) {
      testing::ProcessSpec spec;
      spec.argv = {RG_RUN_BINARY,
                   "--nnodes",
                   std::to_string(nodes),
                   "--node-rank",
                   std::to_string(node),
                   "--nproc-per-node",
                   std::to_string(ranks / nodes),
                   "--master-port",
                   port,
                   "--max-restarts",
                   std::to_string(max_restarts),
                   binary_,
                   "--model",
                   "toynet",
                   "--dataset",
                   "mnist",
                   "--data-dir",
                   (dir_ / "mnist").string(),
                   "--epochs",
                   "3",
                   "--batch-size",
                   std::to_string(192 / ranks / 6),
                   "--test-batch-size",
                   "64",
                   "--workers",
                   "0",
                   "--seed",
                   "5",
                   "--optimizer",
                   optimizer_,
                   "--lr-schedule",
                   "cosine",
                   "--snapshot",
                   (dir_ / snapshot).string(),
                   "--snapshot-every",
                   "4"};
      spec.argv.insert(spec.argv.end(), extra_args_.begin(), extra_args_.end());
      if (!fault.empty()) spec.env.push_back("RG_TEST_FAULT=" + fault);
      if (nodes > 1) spec.env.push_back("RG_STORE_TOKEN=two-nodes");
      spec.env.push_back("RG_NUM_THREADS=1");
      spec.env.insert(spec.env.end(), env_.begin(), env_.end());
      specs.push_back(spec);
    }
    return testing::run_processes(specs, dir_, 240);
  }
  testing::ProcessResult run(int ranks, const std::string& snapshot, const std::string& fault,
                             int max_restarts = 1) {
    return run_nodes(ranks, 1, snapshot, fault, max_restarts)[0];
  }

  // The uninterrupted run and the one with `fault`: both succeed, the faulted one restarted,
  // and their final snapshots are the same bytes. Returns the faulted run.
  testing::ProcessResult expect_identical_after(int ranks, const std::string& fault,
                                                bool resumes = true) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks, fault " + fault);
    const testing::ProcessResult clean = run(ranks, "clean.safetensors", "");
    EXPECT_EQ(clean.exit_code, 0) << clean.out;
    const testing::ProcessResult faulted = run(ranks, "faulted.safetensors", fault);
    // Killed before the first snapshot (taken after step 4) the restarted job starts over.
    testing::expect_restarted_once(faulted, resumes);
    const std::string a = testing::file_contents(dir_ / "clean.safetensors");
    const std::string b = testing::file_contents(dir_ / "faulted.safetensors");
    EXPECT_FALSE(a.empty());
    EXPECT_TRUE(a == b) << "the final snapshots differ\n" << faulted.out;
    for (const auto& [name, wanted] : expect_in_snapshot_)
      EXPECT_EQ(a.find(name) != std::string::npos, wanted) << name;
    fs::remove(dir_ / "clean.safetensors");
    fs::remove(dir_ / "faulted.safetensors");
    return faulted;
  }

  std::string binary_ = RG_TRAIN_BINARY;  // the trainer the workers run
  std::string optimizer_ = "adamw";
  std::vector<std::string> extra_args_;  // more ringgrad-train flags
  std::vector<std::string> env_;         // more variables for the launchers and their workers
  // Tensor or metadata names the final snapshot must (true) or must not (false) hold.
  std::vector<std::pair<std::string, bool>> expect_in_snapshot_;
};

// Kill -9 of a random rank after a random optimizer step (printed, to reproduce a failure).
TEST_F(SnapshotRestart, KillAtARandomStepEndsBitIdenticalAt2And4Ranks) {
  std::random_device rd;
  std::mt19937 gen(rd());
  for (int ranks : {2, 4}) {
    const int step = std::uniform_int_distribution<int>(1, 17)(gen);
    const int victim = std::uniform_int_distribution<int>(0, ranks - 1)(gen);
    std::cout << ranks << " ranks: killing rank " << victim << " after step " << step << "\n";
    expect_identical_after(ranks, "step:" + std::to_string(step) + ":" + std::to_string(victim),
                           step > 4);
  }
}

// During the evaluation after epoch 2 (rank 1), and just before the snapshot of step 8 is
// written (rank 0, the writer: the previous snapshot stays, written atomically).
TEST_F(SnapshotRestart, KillDuringEvaluationOrBeforeASnapshotWrite) {
  expect_identical_after(2, "eval:2:1");
  expect_identical_after(2, "snapshot:8:0");
}

// Two launchers as two nodes of 2 ranks each: rank 3 (node 1) killed after step 9; both
// launchers restart their workers, which resume from the snapshot, and the result is identical.
TEST_F(SnapshotRestart, TwoNodesRestartTogetherAndEndBitIdentical) {
  const auto clean = run_nodes(4, 2, "clean.safetensors", "");
  for (const auto& r : clean) ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto faulted = run_nodes(4, 2, "faulted.safetensors", "step:9:3");
  for (const auto& r : faulted) {
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("restarting the workers (restart 1 of 1)"), std::string::npos) << r.out;
  }
  // Node 1 reports its killed rank; node 0 stops on that report or on its own ranks' failing
  // collectives, whichever comes first.
  EXPECT_NE(faulted[1].out.find("was killed by SIGKILL"), std::string::npos) << faulted[1].out;
  EXPECT_NE(faulted[0].out.find("ringgrad-train: resumed from"), std::string::npos)
      << faulted[0].out;
  EXPECT_TRUE(testing::file_contents(dir_ / "clean.safetensors") ==
              testing::file_contents(dir_ / "faulted.safetensors"));
}

// PowerSGD (from the third step) carries per-rank error feedback and Q factors between steps; the
// snapshot keeps every rank's (gathered to rank 0, the writer), so the last rank killed after
// step 10 resumes from step 8's snapshot and ends identical, the final snapshots' errors
// included, at 2 and 4 ranks.
TEST_F(SnapshotRestart, PowerSgdErrorFeedbackAndFactorsSurviveAKill) {
  extra_args_ = {"--comm-hook", "powersgd", "--powersgd-start-iter", "2"};
  expect_in_snapshot_ = {{"powersgd.rank0.bucket0.error", true},
                         {"powersgd.rank1.bucket0.error", true},
                         {"powersgd.bucket0.q", true},
                         {"powersgd.rank1.bucket0.q", false},  // the Q's agree across ranks
                         {"\"ddp.synced_iterations\":\"18\"", true}};
  expect_identical_after(2, "step:10:1");
  expect_in_snapshot_.push_back({"powersgd.rank3.bucket0.error", true});
  expect_identical_after(4, "step:10:3");
}

// --cuda-graphs with f16 autocast on 2 emulated GPUs over the emulated NCCL: from step 3 each
// step (forward with dropout, backward, DDP's all-reduces, the GradScaler's unscale and AdamW's
// update, the cosine schedule's rate) is a replay, with the GradScaler's scale and growth tracker
// and AdamW's step counts on the device. Rank 1 killed after step 10 resumes from step 8's
// snapshot (warm-up steps and a new capture) and ends byte-identical, the scaler's state and the
// step counts included.
TEST_F(SnapshotRestart, CudaGraphsWithF16OnEmulatedGpusSurviveAKill) {
  binary_ = RG_TRAIN_EMU_BINARY;
  extra_args_ = {"--device", "cuda", "--backend", "nccl", "--cuda-graphs", "--amp", "f16"};
  env_ = {"RG_EMU_DEVICES=2"};
  expect_in_snapshot_ = {{"scaler.scale", true},
                         {"scaler.growth_tracker", true},
                         {"optimizer.0.step", true},  // read back from the device
                         {"optimizer.0.exp_avg", true}};
  const testing::ProcessResult faulted = expect_identical_after(2, "step:10:1");
  // The restarted workers: steps 9-10 eager, 11 captured and replayed, 12-18 replayed.
  EXPECT_NE(faulted.out.find("CUDA graphs: 1 capture(s), 8 replayed steps, 2 eager steps"),
            std::string::npos)
      << faulted.out;
}

// Rank 0 killed half-way through writing the snapshot of step 8 (part of the file in its
// temporary file, not renamed): the job resumes from the previous one (epoch 1's end, step 6)
// and ends identical. The
// killed write's temporary file is removed by the restarted job's first snapshot, so none is
// left at the end.
TEST_F(SnapshotRestart, KillHalfWayThroughASnapshotWrite) {
  const testing::ProcessResult faulted = expect_identical_after(2, "snapshot-write:8:0");
  EXPECT_NE(faulted.out.find("ringgrad-train: resumed from " +
                             (dir_ / "faulted.safetensors").string() + " after epoch 1 (step 6)"),
            std::string::npos)
      << faulted.out;
  EXPECT_NE(faulted.out.find("removed 1 temporary file(s) of an unfinished write of"),
            std::string::npos)
      << faulted.out;
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

// A finished run's snapshot: the identical command has nothing left to do. The run shape is still
// checked first: these 4 ranks run batch 8 (2 ranks ran 16), which is refused with the reason
// (another world size alone resumes: ElasticResume).
TEST_F(SnapshotRestart, AFinishedRunHasNothingLeftAndAnotherRunShapeIsRefused) {
  const testing::ProcessResult first = run(2, "s.safetensors", "");
  ASSERT_EQ(first.exit_code, 0) << first.out;
  // The same command again (a restart after the last snapshot was written): nothing to do, exit 0,
  // the snapshot untouched.
  const std::string before = testing::file_contents(dir_ / "s.safetensors");
  const testing::ProcessResult again = run(2, "s.safetensors", "", 0);
  EXPECT_EQ(again.exit_code, 0) << again.out;
  EXPECT_NE(again.out.find("is of a finished run (step 18); nothing left to do"), std::string::npos)
      << again.out;
  EXPECT_TRUE(testing::file_contents(dir_ / "s.safetensors") == before);
  const testing::ProcessResult other = run(4, "s.safetensors", "", 0);
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.out.find("the checkpoint's batch_size is '16', this run's is '8'"),
            std::string::npos)
      << other.out;
}

}  // namespace
}  // namespace rg
