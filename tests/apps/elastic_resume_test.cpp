// A snapshot resumed at another world size (as torchrun's elastic restarts do): the samples left
// of the snapshot's epoch are re-split over the new ranks, so that together with what the first
// run trained on before its snapshot every sample of that epoch is seen exactly once; every rank
// runs the same number of steps; and a restart inside the re-split epoch is still exact. Which
// samples each rank trained on comes from the trainer's RG_TEST_SAMPLE_LOG (one line per batch).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "support/idx_files.h"
#include "support/processes.h"
#include "support/scratch_dir.h"

namespace rg {
namespace {

namespace fs = std::filesystem;

constexpr int kTrain = 192, kBatch = 16;

// One logged batch: the rank, the epoch, the global step and the samples.
struct LoggedBatch {
  int rank = 0, epoch = 0;
  int64_t step = 0;
  std::vector<int64_t> samples;
};

std::vector<LoggedBatch> read_sample_log(const fs::path& dir, int ranks) {
  std::vector<LoggedBatch> out;
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(dir / ("rank" + std::to_string(r) + ".txt"));
    EXPECT_TRUE(in.good()) << "no sample log of rank " << r << " in " << dir;
    for (std::string line; std::getline(in, line);) {
      std::istringstream ss(line);
      LoggedBatch b;
      b.rank = r;
      ss >> b.epoch >> b.step;
      for (int64_t i; ss >> i;) b.samples.push_back(i);
      out.push_back(b);
    }
  }
  return out;
}

class ElasticResume : public testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    fs::create_directories(dir_ / "mnist");
    testing::write_small_mnist(dir_ / "mnist", kTrain, 64, 1);
  }

  // ToyNet for 3 epochs at batch 16 per rank, under ringgrad-run with `ranks` workers (or one
  // plain process when ranks is 1), snapshots to `snapshot` every `every` steps; `env` adds
  // variables (the sample log, a fault).
  testing::ProcessResult run(int ranks, const std::string& snapshot, int every,
                             std::vector<std::string> env, int max_restarts = 0,
                             const std::vector<std::string>& extra = {}) {
    testing::ProcessSpec spec;
    if (ranks > 1)
      spec.argv = {RG_RUN_BINARY, "--nproc-per-node", std::to_string(ranks),       "--master-port",
                   "0",           "--max-restarts",   std::to_string(max_restarts)};
    for (const std::string& a : {std::string(RG_TRAIN_BINARY),
                                 std::string("--model"),
                                 std::string("toynet"),
                                 std::string("--dataset"),
                                 std::string("mnist"),
                                 std::string("--data-dir"),
                                 (dir_ / "mnist").string(),
                                 std::string("--epochs"),
                                 std::string("3"),
                                 std::string("--batch-size"),
                                 std::to_string(kBatch),
                                 std::string("--test-batch-size"),
                                 std::string("64"),
                                 std::string("--workers"),
                                 std::string("0"),
                                 std::string("--seed"),
                                 std::string("5"),
                                 std::string("--optimizer"),
                                 std::string("adamw"),
                                 std::string("--lr-schedule"),
                                 std::string("cosine"),
                                 std::string("--snapshot"),
                                 (dir_ / snapshot).string(),
                                 std::string("--snapshot-every"),
                                 std::to_string(every)})
      spec.argv.push_back(a);
    spec.argv.insert(spec.argv.end(), extra.begin(), extra.end());
    spec.env = std::move(env);
    spec.env.push_back("RG_NUM_THREADS=1");
    return testing::run_processes({spec}, dir_, 240)[0];
  }

  // A log directory for RG_TEST_SAMPLE_LOG.
  std::string log_dir(const std::string& name) {
    fs::create_directories(dir_ / name);
    return "RG_TEST_SAMPLE_LOG=" + (dir_ / name).string();
  }

  // The first run: 2 ranks (6 steps per epoch), a snapshot every 4 steps, rank 1 killed after
  // step 9 without restarts. Its last snapshot is step 8: epoch 2 after 2 of its steps, so 64 of
  // the epoch's samples were trained on and 128 are left. Copied to each of `copies`.
  std::vector<LoggedBatch> interrupted_two_rank_run(const std::vector<std::string>& copies,
                                                    const std::vector<std::string>& extra = {}) {
    const testing::ProcessResult first =
        run(2, "first.safetensors", 4, {log_dir("log_first"), "RG_TEST_FAULT=step:9:1"}, 0, extra);
    EXPECT_NE(first.exit_code, 0) << first.out;
    EXPECT_NE(first.out.find("epoch 2 step 2/6"), std::string::npos) << first.out;
    EXPECT_TRUE(fs::exists(dir_ / "first.safetensors")) << first.out;
    for (const std::string& c : copies) fs::copy_file(dir_ / "first.safetensors", dir_ / c);
    return read_sample_log(dir_ / "log_first", 2);
  }
};

// Every sample of epoch 2 exactly once: the first run's batches up to its snapshot's step 8 and
// the resumed run's batches of that epoch; the resumed ranks all run the same number of steps.
void expect_epoch_seen_once(const std::vector<LoggedBatch>& before,
                            const std::vector<LoggedBatch>& after, int after_ranks) {
  std::map<int64_t, int> seen;
  for (const LoggedBatch& b : before)
    if (b.epoch == 2 && b.step <= 8)
      for (int64_t i : b.samples) ++seen[i];
  std::map<int, int> steps_per_rank;
  std::map<int64_t, std::vector<size_t>> sizes_per_step;
  for (const LoggedBatch& b : after) {
    if (b.epoch != 2) continue;
    for (int64_t i : b.samples) ++seen[i];
    ++steps_per_rank[b.rank];
    sizes_per_step[b.step].push_back(b.samples.size());
    EXPECT_GE(b.samples.size(), 1u);
    EXPECT_LE(b.samples.size(), size_t(kBatch));
  }
  ASSERT_EQ(int(seen.size()), kTrain) << "samples of epoch 2 never trained on";
  for (const auto& [i, n] : seen) EXPECT_EQ(n, 1) << "sample " << i << " seen " << n << " times";
  ASSERT_EQ(int(steps_per_rank.size()), after_ranks);
  for (const auto& [r, n] : steps_per_rank)
    EXPECT_EQ(n, steps_per_rank.begin()->second) << "rank " << r << " ran another step count";
  for (const auto& [step, sizes] : sizes_per_step) {
    const auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
    EXPECT_LE(*hi - *lo, 1u) << "step " << step << ": the ranks' batches differ by more than one";
  }
}

// 2 ranks -> 3 ranks: 128 samples left re-split into 3 steps of 14 or 15 per rank; epoch 3 is
// the plain 3-rank sampler. A kill inside the re-split epoch, restarted at 3 ranks, rebuilds the
// same re-split and ends byte-identical to the uninterrupted 3-rank continuation.
TEST_F(ElasticResume, TwoRanksToThreeSeesEveryRemainingSampleOnceAndRestartsExactly) {
  const std::vector<LoggedBatch> before =
      interrupted_two_rank_run({"clean.safetensors", "faulted.safetensors"});
  const testing::ProcessResult clean = run(3, "clean.safetensors", 1, {log_dir("log_clean")});
  ASSERT_EQ(clean.exit_code, 0) << clean.out;
  EXPECT_NE(clean.out.find("the snapshot is from 2 ranks, this run has 3: the 128 samples left of "
                           "epoch 2 are re-split into 3 steps of 14 to 15 samples per rank"),
            std::string::npos)
      << clean.out;
  const std::vector<LoggedBatch> after = read_sample_log(dir_ / "log_clean", 3);
  expect_epoch_seen_once(before, after, 3);
  // Epoch 3 is the 3-rank sampler's: 4 steps of 16 per rank, steps 12 to 15.
  int epoch3 = 0;
  for (const LoggedBatch& b : after)
    if (b.epoch == 3) {
      ++epoch3;
      EXPECT_EQ(b.samples.size(), size_t(kBatch));
      EXPECT_GE(b.step, 12);
      EXPECT_LE(b.step, 15);
    }
  EXPECT_EQ(epoch3, 3 * 4);
  EXPECT_NE(clean.out.find("\"steps\":15"), std::string::npos) << clean.out;

  // Killed after step 10 (re-split step 2 of 3) before its snapshot: the restart resumes from
  // step 9's snapshot inside the re-split epoch.
  const testing::ProcessResult faulted =
      run(3, "faulted.safetensors", 1, {"RG_TEST_FAULT=step:10:2"}, 1);
  ASSERT_EQ(faulted.exit_code, 0) << faulted.out;
  EXPECT_NE(faulted.out.find("resumed from"), std::string::npos) << faulted.out;
  EXPECT_NE(faulted.out.find("in epoch 2 after 1 of its steps (step 9)"), std::string::npos)
      << faulted.out;
  EXPECT_TRUE(testing::file_contents(dir_ / "clean.safetensors") ==
              testing::file_contents(dir_ / "faulted.safetensors"))
      << "the restarted re-split run ended with other bytes than the uninterrupted one";
}

// 2 ranks -> 1 process without a launcher: the one process trains on the 128 samples left in
// steps of 16 (8 steps), then epoch 3 with the single-process sampler (12 steps).
TEST_F(ElasticResume, TwoRanksToOneProcess) {
  const std::vector<LoggedBatch> before = interrupted_two_rank_run({"one.safetensors"});
  const testing::ProcessResult one = run(1, "one.safetensors", 4, {log_dir("log_one")});
  ASSERT_EQ(one.exit_code, 0) << one.out;
  const std::vector<LoggedBatch> after = read_sample_log(dir_ / "log_one", 1);
  expect_epoch_seen_once(before, after, 1);
  EXPECT_NE(one.out.find("\"steps\":28"), std::string::npos) << one.out;  // 8 + 8 + 12
}

// With PowerSGD (started at iteration 2, so the snapshot holds its state): the ranks' error
// feedback cannot be mapped onto 3 ranks, so it restarts from zero with the Q's kept, said in one
// line, and the re-split epoch still sees every sample once.
TEST_F(ElasticResume, PowerSgdContinuesAtThreeRanksWithZeroErrorFeedback) {
  const std::vector<std::string> psgd = {"--comm-hook", "powersgd", "--powersgd-start-iter", "2"};
  const std::vector<LoggedBatch> before = interrupted_two_rank_run({"p.safetensors"}, psgd);
  const testing::ProcessResult three = run(3, "p.safetensors", 4, {log_dir("log_p")}, 0, psgd);
  ASSERT_EQ(three.exit_code, 0) << three.out;
  EXPECT_NE(three.out.find("the error feedback starts at zero"), std::string::npos) << three.out;
  expect_epoch_seen_once(before, read_sample_log(dir_ / "log_p", 3), 3);
}

}  // namespace
}  // namespace rg
