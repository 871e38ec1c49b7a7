// ringgrad-bench train --device cuda (apps/train_bench.h) on the emulated CUDA device: the model
// and the batches on the device, a rate per timed window, peak device memory, the JSON figures
// (which the GPU kit's `run` reads), gpt-nano's tokens/s with bf16 autocast, and the usage errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/train_bench.h"
#include "kernels/error.h"
#include "support/scratch_dir.h"

namespace rg::apps {
namespace {

class TrainBenchEmu : public testing::ScratchDirTest {
 protected:
  nlohmann::json run(TrainBenchOptions o) {
    o.json_path = (dir_ / "bench.json").string();
    EXPECT_EQ(run_train_bench(o), 0);
    return nlohmann::json::parse(testing::file_contents(o.json_path));
  }
};

// Options for a short run (designated initializers would have to name every field).
TrainBenchOptions short_run(const std::string& model, int64_t batch, const std::string& device,
                            int windows) {
  TrainBenchOptions o;
  o.model = model;
  o.batch_size = batch;
  o.device = device;
  o.warmup = 1;
  o.windows = windows;
  o.window_steps = 1;
  return o;
}

TEST_F(TrainBenchEmu, ToyNetOnTheDeviceReportsRatesAndDeviceMemory) {
  const nlohmann::json j = run(short_run("toynet", 4, "cuda", 3));
  EXPECT_EQ(j.at("tool"), "ringgrad");
  EXPECT_EQ(j.at("device"), "cuda:0");
  EXPECT_EQ(j.at("unit"), "img/s");
  ASSERT_EQ(j.at("rates").size(), 3u);
  for (const auto& r : j.at("rates")) EXPECT_GT(r.get<double>(), 0);
  std::vector<double> rates = j.at("rates").get<std::vector<double>>();
  std::sort(rates.begin(), rates.end());
  EXPECT_EQ(j.at("median").get<double>(), rates[1]);
  // The weights, their gradients and momentum, and four batches live on the device.
  EXPECT_GT(j.at("peak_device_mb").get<double>(), 3 * 1199882 * 4 / (1024.0 * 1024.0));
  EXPECT_GE(j.at("peak_reserved_mb").get<double>(), j.at("peak_device_mb").get<double>());
}

TEST_F(TrainBenchEmu, GptNanoCountsTokensWithBf16Autocast) {
  TrainBenchOptions o = short_run("gpt-nano", 2, "cuda:0", 1);
  o.block_size = 16;
  o.amp = "bf16";
  const nlohmann::json j = run(o);
  EXPECT_EQ(j.at("unit"), "tok/s");
  EXPECT_EQ(j.at("block_size"), 16);
  EXPECT_EQ(j.at("amp"), "bf16");
  EXPECT_GT(j.at("median").get<double>(), 0);
  EXPECT_GT(j.at("peak_device_mb").get<double>(), 0);
}

// gpt-nano trains with minGPT's AdamW: under f16 its GradScaler leaves the skip to the device
// (AdamW's step counts move there), so the step is captured after the warm-up and replayed.
TEST_F(TrainBenchEmu, GptNanoWithF16AndAdamWReplaysItsCapturedStep) {
  TrainBenchOptions o = short_run("gpt-nano", 2, "cuda", 4);  // 5 steps
  o.block_size = 16;
  o.amp = "f16";
  o.cuda_graphs = true;
  const nlohmann::json j = run(o);
  EXPECT_EQ(j.at("cuda_graph_captures"), 1);
  EXPECT_EQ(j.at("cuda_graph_eager_steps"), 2) << "the warm-up";
  EXPECT_EQ(j.at("cuda_graph_replays"), 3);
  EXPECT_GT(j.at("median").get<double>(), 0);
}

TEST_F(TrainBenchEmu, UsageErrorsNameTheProblem) {
  TrainBenchOptions o = short_run("toynet", 4, "cuda:7", 1);
  try {
    run_train_bench(o);
    FAIL() << "expected an rg::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:7: that device does not exist"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace rg::apps
