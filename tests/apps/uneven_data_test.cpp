// ringgrad-train --uneven-data over 2 ranks (the real ringgrad-run and ringgrad-train binaries,
// small MNIST files the test writes): rank 1 leaves out its last batch of each epoch. With --join
// the run ends normally, every rank counting the full epoch's steps (the joined rank shadows the
// last one); without it, it ends in DDP's error naming rank 1 and the iteration on every rank,
// well before the collective timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/idx_files.h"
#include "support/processes.h"
#include "support/scratch_dir.h"

namespace rg::app {
namespace {

using testing::ProcessResult;

class UnevenData : public testing::ScratchDirTest {
 protected:
  // 200 samples, batch 16 per rank: 7 batches per rank and epoch (6 on rank 1).
  static constexpr uint32_t kTrain = 200, kTest = 40;
  static constexpr int kStepsPerEpoch = 7;
  void SetUp() override {
    ScratchDirTest::SetUp();
    testing::write_small_mnist(dir_, kTrain, kTest, 5);
  }
  ProcessResult run_two_ranks(const std::string& flags) const {
    const std::string command = std::string(RG_RUN_BINARY) +
                                " --nproc-per-node 2 --master-port 0 " + RG_TRAIN_BINARY +
                                " --dataset mnist --data-dir " + dir_.string() +
                                " --workers 0 --batch-size 16 --timeout-s 60 " + flags;
    std::vector<std::string> argv;
    std::istringstream words(command);
    for (std::string w; words >> w;) argv.push_back(w);
    return testing::run_processes({{argv, {}}}, dir_, 300)[0];
  }
};

TEST_F(UnevenData, WithJoinTheRunEndsAndEveryRankCountsTheFullEpoch) {
  // With gradient accumulation too: rank 1 runs out inside the window of steps 5-7 (after its 6th
  // batch) and shadows the synchronized backward of step 7.
  for (const std::string accum : {"1", "4"}) {
    const std::string metrics = (dir_ / ("m" + accum + ".jsonl")).string();
    const ProcessResult r =
        run_two_ranks("--uneven-data --join --epochs 2 --model mlp " +
                      std::string("--grad-accum-steps ") + accum + " --metrics " + metrics);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::ifstream f(metrics);
    std::string line, last;
    while (std::getline(f, line))
      if (!line.empty()) last = line;
    const auto j = nlohmann::json::parse(last);
    EXPECT_EQ(j["steps"], 2 * kStepsPerEpoch) << last;
    EXPECT_EQ(r.out.find("ran out of data"), std::string::npos) << r.out;
  }
}

TEST_F(UnevenData, WithoutJoinEveryRankFailsNamingTheRankAndIteration) {
  const auto start = std::chrono::steady_clock::now();
  const ProcessResult r = run_two_ranks("--uneven-data --epochs 1 --model mlp");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_LT(seconds, 45) << "an error, not the 60 s timeout";
  for (const char* part : {"reduction could not finish in iteration 6",
                           "rank 1: ran out of data (its last batch was iteration 6)",
                           "rank 0: had more batches after iteration 6", "--join"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
}

}  // namespace
}  // namespace rg::app
