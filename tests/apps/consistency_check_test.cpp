// ringgrad-train --check-consistency end to end under ringgrad-run at 2 ranks: a normal run passes
// every check (in DETAIL the averaged gradients are compared too), and a rank whose weight drifts
// (RG_TEST_FAULT=perturb:N:R, the trainer's fault injection for these tests) stops the job at the
// next check with the error naming the tensor, the step and the ranks holding each hash.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "support/idx_files.h"
#include "support/processes.h"
#include "support/scratch_dir.h"

namespace rg {
namespace {

class CheckConsistency : public testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    std::filesystem::create_directories(dir_ / "mnist");
    testing::write_small_mnist(dir_ / "mnist", 64, 16, 1);
  }

  // The MLP for 3 epochs of 2 steps of 16 samples per rank, checked every 2 optimizer steps.
  testing::ProcessResult run(const std::vector<std::string>& env,
                             const std::vector<std::string>& extra = {}) {
    testing::ProcessSpec spec;
    spec.argv = {RG_RUN_BINARY, "--nproc-per-node", "2", "--master-port", "0", RG_TRAIN_BINARY};
    std::istringstream args(
        "--model mlp --dataset mnist --epochs 3 --max-steps 6 --batch-size 16 --workers 0 "
        "--seed 3 --check-consistency 2 --data-dir");
    for (std::string a; args >> a;) spec.argv.push_back(a);
    spec.argv.push_back((dir_ / "mnist").string());
    spec.argv.insert(spec.argv.end(), extra.begin(), extra.end());
    spec.env = env;
    spec.env.push_back("RG_NUM_THREADS=1");
    return testing::run_processes({spec}, dir_, 120)[0];
  }
};

TEST_F(CheckConsistency, ANormalRunPassesEveryCheckAlsoComparingGradientsInDetail) {
  for (const char* level : {"OFF", "DETAIL"}) {
    const testing::ProcessResult r = run({}, {"--debug-distributed", level});
    EXPECT_EQ(r.exit_code, 0) << level << "\n" << r.out;
    EXPECT_EQ(r.out.find("differs"), std::string::npos) << r.out;
  }
}

TEST_F(CheckConsistency, AWeightPerturbedOnRankOneStopsTheRunAtTheNextCheckNamingIt) {
  // Perturbed after step 3: the check after step 2 passed, the one after step 4 names it.
  const testing::ProcessResult r = run({"RG_TEST_FAULT=perturb:3:1"});
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("error: consistency check at step 4: fc1.weight differs between ranks: "
                       "rank 0 has 0x"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("; rank 1 has 0x"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("at step 2:"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace rg
