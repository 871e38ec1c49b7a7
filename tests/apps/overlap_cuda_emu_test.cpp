// ringgrad-bench overlap --device cuda --sim-link on the emulated GPU (ringgrad-bench-emu): one
// process trains ToyNet on cuda:0 while each bucket's all-reduce is a modelled transfer on the NCCL
// stream (the link's time for 8 ranks, no data moved). Checks that the transfers are on the NCCL
// stream's lane of the trace with the link model's durations, that overlapping hides
// communication that not overlapping exposes, and that ringgrad-bench scale, given the step
// profile this run took from the GPU timeline (CUDA events), predicts the measured iteration
// within 10 %. The figures are the emulator's (kernels run on the CPU), not a GPU's.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "apps/trace_file.h"
#include "comm/sim_link.h"
#include "layers/models/registry.h"
#include "support/processes.h"
#include "support/scratch_dir.h"

namespace rg::apps {
namespace {

using Csv = std::vector<std::map<std::string, std::string>>;

Csv read_csv(const std::filesystem::path& path) {
  std::istringstream in(testing::file_contents(path));
  std::string line;
  std::vector<std::string> head;
  Csv rows;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ls(line);
    std::string cell;
    while (std::getline(ls, cell, ',')) cells.push_back(cell);
    if (head.empty()) {
      head = cells;
      continue;
    }
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < head.size() && i < cells.size(); ++i) row[head[i]] = cells[i];
    rows.push_back(row);
  }
  return rows;
}

double num(const std::map<std::string, std::string>& row, const std::string& key) {
  return std::stod(row.at(key));
}

class OverlapCudaEmu : public testing::ScratchDirTest {
 protected:
  testing::ProcessResult run(const std::string& binary, std::vector<std::string> args) {
    args.insert(args.begin(), binary);
    return testing::run_processes({{args, {"RG_NUM_THREADS=1"}}}, dir_, 600)[0];
  }
};

// Slow enough that the transfers outweigh emulated compute, whose time a loaded machine moves
// most (and whose DDP bucket copies, 25-30 ms per iteration here, the profile does not hold).
constexpr const char* kLink = "0.02,100";
constexpr int kRanks = 8, kIters = 4;

TEST_F(OverlapCudaEmu, ModelledTransfersOverlapOnTheNcclLaneAndScaleAgrees) {
  const std::string csv = (dir_ / "overlap.csv").string(), trace = (dir_ / "trace.json").string();
  const auto bench =
      run(RG_BENCH_EMU_BINARY,
          {"overlap", "--device", "cuda", "--model", "toynet", "--batch-size", "16", "--sim-link",
           kLink, "--sim-ranks", std::to_string(kRanks), "--bucket-mb", "1,single", "--warmup",
           "2", "--iters", std::to_string(kIters), "--stat", "min", "--csv", csv, "--trace", trace,
           "--profile-out", (dir_ / "p-{bucket}.json").string()});
  ASSERT_EQ(bench.exit_code, 0) << bench.out;

  // The table: ToyNet's gradients in 2 buckets under a 1 MiB cap, 1 with "single".
  std::map<std::pair<std::string, bool>, std::map<std::string, std::string>> row;
  for (const auto& r : read_csv(csv)) row[{r.at("bucket_mb"), r.at("overlap") == "1"}] = r;
  ASSERT_EQ(row.size(), 4u) << testing::file_contents(csv);
  const auto& capped = row.at({"1", true});
  const auto& capped_serial = row.at({"1", false});
  const auto& single = row.at({"single", true});
  EXPECT_EQ(num(capped, "buckets"), 2);
  EXPECT_EQ(num(single, "buckets"), 1);
  // Communication is the link model's time for the buckets: one all-reduce of every gradient.
  const auto model = nn::make_model({.name = "toynet", .sample_shape = {1, 28, 28}, .num_classes = 10});
  const double grad_bytes = 4.0 * double(model->parameter_count());
  const double one_allreduce_ms = dist::parse_sim_link(kLink).allreduce_us(grad_bytes, kRanks) / 1e3;
  EXPECT_NEAR(num(single, "comm_ms"), one_allreduce_ms, 1e-3 * one_allreduce_ms);
  EXPECT_NEAR(num(capped, "comm_ms"), one_allreduce_ms + 0.1, 0.01 * one_allreduce_ms);
  // Overlapped, the first bucket's transfer runs under the rest of backward; not overlapped, both
  // wait for the end of backward.
  EXPECT_LT(num(capped, "iter_ms"), num(capped_serial, "iter_ms"));
  EXPECT_GT(num(capped, "efficiency"), num(capped_serial, "efficiency") + 0.05);
  EXPECT_GT(num(capped, "efficiency"), num(single, "efficiency") + 0.05);

  // The transfers on the trace: spans of the NCCL stream's lane, as long as the link model says.
  const Trace t = read_trace(trace);
  int modelled = 0;
  for (const TraceEvent& e : t.events) {
    if (e.name.rfind("all_reduce", 0) != 0 || e.name.find("modelled") == std::string::npos)
      continue;
    ++modelled;
    EXPECT_NE(t.lane_name(e).find("NCCL stream"), std::string::npos) << t.lane_name(e);
    EXPECT_TRUE(t.on_stream(e)) << e.name;
    if (e.name.find("f32[" + std::to_string(model->parameter_count()) + "]") != std::string::npos) {
      EXPECT_NEAR(e.dur / 1e3, one_allreduce_ms, 0.1 * one_allreduce_ms) << e.name;
    }
  }
  // Timed iterations: (2 + 2 + 1 + 1) buckets per round of the four configurations.
  EXPECT_EQ(modelled, 6 * kIters);

  // ringgrad-bench scale on each cap's profile (compute-only iterations sampled between that
  // cap's DDP iterations, times from CUDA events) predicts the measured overlapped iteration.
  for (const std::string cap : {"1", "single"}) {
    const std::string scale_csv = (dir_ / ("scale-" + cap + ".csv")).string();
    const auto scale = run(RG_BENCH_BINARY, {"scale", "--trace", (dir_ / ("p-" + cap + ".json")).string(),
                                             "--sim-link", kLink, "--gpus", std::to_string(kRanks),
                                             "--bucket-mb", cap, "--csv", scale_csv});
    ASSERT_EQ(scale.exit_code, 0) << scale.out;
    const Csv predicted = read_csv(scale_csv);
    ASSERT_EQ(predicted.size(), 1u);
    const double measured = num(row.at({cap, true}), "iter_ms");
    const double pred = num(predicted[0], "step_ms");
    EXPECT_NEAR(pred, measured, 0.10 * measured) << "bucket cap " << cap << "\n" << scale.out;
    EXPECT_NEAR(num(predicted[0], "comm_ms"), num(row.at({cap, true}), "comm_ms"),
                0.01 * measured);
  }
}

TEST_F(OverlapCudaEmu, OneProcessWithoutALinkModelIsRefusedWithWhatToDo) {
  const auto r = run(RG_BENCH_EMU_BINARY, {"overlap", "--device", "cuda", "--model", "toynet"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("give --sim-link"), std::string::npos) << r.out;
  const auto no_ranks = run(RG_BENCH_EMU_BINARY, {"overlap", "--device", "cuda", "--model",
                                                  "toynet", "--sim-link", "nvlink-h100"});
  EXPECT_EQ(no_ranks.exit_code, 1);
  EXPECT_NE(no_ranks.out.find("--sim-ranks"), std::string::npos) << no_ranks.out;
}

}  // namespace
}  // namespace rg::apps
