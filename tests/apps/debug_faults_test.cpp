// A stopped rank in a real training job (ringgrad-run over ringgrad-train, 2 and 3 ranks): the
// others' collective fails within --timeout-s naming it, every rank that can dumps its flight
// recorder (the failing ones on their own, the rest on the launcher's request), and the analysis
// of the dumps (ringgrad-bench flight) names the rank without a dump as the likely cause and
// where the others wait.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/flight_analyzer.h"
#include "support/idx_files.h"
#include "support/processes.h"
#include "support/scratch_dir.h"

namespace rg {
namespace {

namespace fs = std::filesystem;

class DebugFaults : public testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    fs::create_directories(dir_ / "mnist");
    testing::write_small_mnist(dir_ / "mnist", 192, 64, 1);
    fs::create_directories(dir_ / "flight");
  }

  testing::ProcessResult train(int ranks, const std::string& fault) {
    testing::ProcessSpec spec;
    spec.argv = {RG_RUN_BINARY,
                 "--nproc-per-node",
                 std::to_string(ranks),
                 "--master-port",
                 "0",
                 RG_TRAIN_BINARY,
                 "--model",
                 "toynet",
                 "--dataset",
                 "mnist",
                 "--data-dir",
                 (dir_ / "mnist").string(),
                 "--epochs",
                 "2",
                 "--batch-size",
                 "8",
                 "--workers",
                 "0",
                 "--timeout-s",
                 "3"};
    spec.env = {"RG_TEST_FAULT=" + fault, "RG_NUM_THREADS=1",
                "RG_FLIGHT_RECORDER_DIR=" + (dir_ / "flight").string()};
    return testing::run_processes({spec}, dir_, 120)[0];
  }

  std::string analysis() {
    std::vector<apps::FlightDump> dumps;
    for (const auto& f : fs::directory_iterator(dir_ / "flight"))
      if (f.path().extension() == ".json") dumps.push_back(apps::read_flight_dump(f.path()));
    return apps::analyze_flight_dumps(dumps);
  }
};

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(DebugFaults, AStoppedRankIsNamedByTheTimeoutAndTheFlightAnalysis) {
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    for (const auto& f : fs::directory_iterator(dir_ / "flight")) fs::remove(f.path());
    const int stopped = ranks - 1;
    const auto t0 = std::chrono::steady_clock::now();
    const testing::ProcessResult r = train(ranks, "stop:5:" + std::to_string(stopped));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << ranks << " ranks: the job ended " << seconds << " s after its start\n";
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_TRUE(has(r.out, "timed out after 3000 ms; ranks that have not joined it: " +
                               std::to_string(stopped)))
        << r.out;
    EXPECT_TRUE(has(r.out, "no flight recorder dump from rank " + std::to_string(stopped)))
        << r.out;
    EXPECT_TRUE(has(r.out, "analyze with: ringgrad-bench flight")) << r.out;
    const std::string a = analysis();
    EXPECT_TRUE(has(a, "no dump from rank " + std::to_string(stopped))) << a;
    EXPECT_TRUE(has(a, "rank " + std::to_string(stopped) + " without a dump is the likely cause"))
        << a;
    EXPECT_TRUE(has(a, "rank 0's all_reduce #")) << a;
    EXPECT_TRUE(has(a, "failed")) << a;
    std::cout << a;
  }
}

}  // namespace
}  // namespace rg
