// ringgrad-train's reproducibility and reporting switches on small MNIST files the tests write:
// --deterministic (two CPU runs give the same weights bit for bit), --cudnn-benchmark on the CPU
// (a no-op with a note), --eval-on-rank0 (the same metrics as the sharded evaluation, 2 ranks),
// the logged losses as means over every rank's samples (2 ranks, checked against a computation of
// both ranks' losses in this process) and bad flag values (exit 2). Multi-rank runs go through
// the real ringgrad-run and ringgrad-train binaries.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "apps/common/trainer.h"
#include "data/dataloader.h"
#include "data/registry.h"
#include "data/sampler.h"
#include "engine/autograd/grad_mode.h"
#include "engine/deterministic.h"
#include "engine/ops/cudnn.h"
#include "engine/ops/loss.h"
#include "engine/serialization.h"
#include "layers/models/registry.h"
#include "support/idx_files.h"
#include "support/processes.h"
#include "support/scratch_dir.h"

namespace rg::app {
namespace {

using testing::ProcessResult;

// Runs `command` (words separated by spaces) with this test's scratch directory for its log.
ProcessResult run(const std::string& command, const std::filesystem::path& log_dir) {
  std::vector<std::string> argv;
  std::istringstream words(command);
  for (std::string w; words >> w;) argv.push_back(w);
  return testing::run_processes({{argv, {}}}, log_dir, 300)[0];
}

nlohmann::json final_line(const std::string& metrics_path) {
  std::ifstream f(metrics_path);
  std::string line, last;
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  return nlohmann::json::parse(last);
}

class DeterminismAndMetrics : public testing::ScratchDirTest {
 protected:
  static constexpr uint32_t kTrain = 200, kTest = 70;
  void SetUp() override {
    ScratchDirTest::SetUp();
    testing::write_small_mnist(dir_, kTrain, kTest, 3);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // ringgrad-train over 2 ranks with the given flags.
  ProcessResult run_two_ranks(const std::string& flags) const {
    return run(std::string(RG_RUN_BINARY) + " --nproc-per-node 2 --master-port 0 " +
                   RG_TRAIN_BINARY + " --dataset mnist --data-dir " + dir_.string() +
                   " --workers 0 --seed 7 " + flags,
               dir_);
  }
};

TEST_F(DeterminismAndMetrics, TwoDeterministicCpuRunsGiveTheSameWeights) {
  std::vector<std::string> files;
  for (int i = 0; i < 2; ++i) {
    TrainConfig c;
    c.model = "toynet";  // convolutions, max pooling, dropout
    c.dataset = "mnist";
    c.data_dir = dir_.string();
    c.batch_size = 32;
    c.lr = 0.05;
    c.seed = 11;
    c.deterministic = true;
    c.checkpoint_path = path("run" + std::to_string(i) + ".safetensors");
    std::ostringstream log;
    train(c, log);
    files.push_back(c.checkpoint_path);
    EXPECT_FALSE(deterministic_algorithms()) << "train() must restore the switch";
  }
  const SafetensorsFile a = load_safetensors(files[0]), b = load_safetensors(files[1]);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  ASSERT_FALSE(a.tensors.empty());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const Tensor& ta = a.tensors[i].second;
    const Tensor& tb = b.tensors[i].second;
    ASSERT_EQ(ta.nbytes(), tb.nbytes()) << a.tensors[i].first;
    EXPECT_EQ(std::memcmp(ta.raw_data(), tb.raw_data(), size_t(ta.nbytes())), 0)
        << a.tensors[i].first << " differs between the two runs";
  }
}

TEST_F(DeterminismAndMetrics, TwoDeterministicRunsOverTwoRanksGiveTheSameWeights) {
  const std::string flags =
      "--model toynet --batch-size 16 --lr 0.05 --deterministic --checkpoint ";
  for (const char* name : {"a.safetensors", "b.safetensors"}) {
    const ProcessResult r = run_two_ranks(flags + path(name));
    ASSERT_EQ(r.exit_code, 0) << r.out;
  }
  const SafetensorsFile a = load_safetensors(path("a.safetensors"));
  const SafetensorsFile b = load_safetensors(path("b.safetensors"));
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const Tensor& ta = a.tensors[i].second;
    const Tensor& tb = b.tensors[i].second;
    ASSERT_EQ(ta.nbytes(), tb.nbytes());
    EXPECT_EQ(std::memcmp(ta.raw_data(), tb.raw_data(), size_t(ta.nbytes())), 0)
        << a.tensors[i].first << " differs between the two runs";
  }
}

TEST_F(DeterminismAndMetrics, CudnnBenchmarkOnTheCpuIsANoOpWithANote) {
  TrainConfig c;
  c.model = "mlp";
  c.dataset = "mnist";
  c.data_dir = dir_.string();
  c.max_steps = 2;
  c.cudnn_benchmark = true;
  c.eval_on_rank0 = true;
  std::ostringstream log;
  train(c, log);
  EXPECT_NE(log.str().find("note: --cudnn-benchmark has no effect on the CPU"), std::string::npos)
      << log.str();
  EXPECT_NE(log.str().find("note: --eval-on-rank0 has no effect without DDP"), std::string::npos)
      << log.str();
  EXPECT_FALSE(cudnn_benchmark()) << "train() must restore the switch";
}

TEST_F(DeterminismAndMetrics, BadFlagValuesAreUsageErrors) {
  for (const char* flag :
       {"--deterministic=maybe", "--cudnn-benchmark=fast", "--eval-on-rank0=x"}) {
    const ProcessResult r = run(std::string(RG_TRAIN_BINARY) + " " + flag, dir_);
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.out;
    EXPECT_NE(r.out.find("Run with --help"), std::string::npos) << flag << ": " << r.out;
  }
}

TEST_F(DeterminismAndMetrics, EvalOnRank0GivesTheShardedEvaluationsMetrics) {
  // 70 test samples in batches of 16: the shards (35 each) and the whole set end in short batches.
  const std::string flags =
      "--model mlp --batch-size 16 --test-batch-size 16 --lr 0.05 --max-steps 4 --metrics ";
  const ProcessResult sharded = run_two_ranks(flags + path("sharded.jsonl"));
  ASSERT_EQ(sharded.exit_code, 0) << sharded.out;
  const ProcessResult rank0 = run_two_ranks(flags + path("rank0.jsonl") + " --eval-on-rank0");
  ASSERT_EQ(rank0.exit_code, 0) << rank0.out;
  const nlohmann::json a = final_line(path("sharded.jsonl")), b = final_line(path("rank0.jsonl"));
  // Exact counts over the same 70 samples.
  EXPECT_EQ(a["top1"].get<double>() * kTest, b["top1"].get<double>() * kTest);
  EXPECT_EQ(a["top5"].get<double>() * kTest, b["top5"].get<double>() * kTest);
  // The same per-sample losses, summed in another grouping (batches of rank 0 vs the shards').
  const double la = a["test_loss"], lb = b["test_loss"];
  EXPECT_NEAR(la, lb, 1e-5 * std::abs(la)) << "test loss";
  EXPECT_GT(la, 0.0);
}

// CIFAR-10 binary batches (five training files, one test file) of samples whose class shows as a
// bright band in one channel.
void write_small_cifar(const std::filesystem::path& dir, int per_train_file, int test) {
  std::mt19937 gen(5);
  const auto write = [&](const std::string& name, int n) {
    std::vector<uint8_t> bytes;
    for (int i = 0; i < n; ++i) {
      const int label = i % 10;
      bytes.push_back(uint8_t(label));
      for (int c = 0; c < 3; ++c)
        for (int p = 0; p < 1024; ++p)
          bytes.push_back(uint8_t(p / 32 / 3 == label && c == label % 3 ? 200 : gen() % 80));
    }
    testing::write_file(dir / name, bytes);
  };
  for (int i = 1; i <= 5; ++i) write("data_batch_" + std::to_string(i) + ".bin", per_train_file);
  write("test_batch.bin", test);
}

std::vector<nlohmann::json> epoch_lines(const std::string& metrics_path) {
  std::ifstream f(metrics_path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(f, line);) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["type"] == "epoch") lines.push_back(j);
  }
  return lines;
}

// ResNet-18 has batch-norm buffers, which each rank updates from its own batches after DDP's
// broadcast: evaluated on rank 0 alone or sharded (after the buffers come from rank 0), both ways
// give the same metrics every epoch, and training after an evaluation on rank 0 goes on as after a
// sharded one (its DDP buffer broadcasts still match).
TEST_F(DeterminismAndMetrics, EvalOnRank0MatchesShardedWithBatchNormBuffers) {
  const std::filesystem::path cifar = dir_ / "cifar";
  std::filesystem::create_directories(cifar);
  write_small_cifar(cifar, 8, 20);
  const std::string flags = std::string(RG_RUN_BINARY) + " --nproc-per-node 2 --master-port 0 " +
                            RG_TRAIN_BINARY + " --model resnet18 --dataset cifar10 --data-dir " +
                            cifar.string() +
                            " --epochs 2 --batch-size 8 --test-batch-size 8 --workers 0 --lr 0.002 "
                            "--seed 3 --metrics ";
  const ProcessResult sharded = run(flags + path("sharded.jsonl"), dir_);
  ASSERT_EQ(sharded.exit_code, 0) << sharded.out;
  const ProcessResult rank0 = run(flags + path("rank0.jsonl") + " --eval-on-rank0", dir_);
  ASSERT_EQ(rank0.exit_code, 0) << rank0.out;
  const std::vector<nlohmann::json> a = epoch_lines(path("sharded.jsonl"));
  const std::vector<nlohmann::json> b = epoch_lines(path("rank0.jsonl"));
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    SCOPED_TRACE("epoch " + std::to_string(e + 1));
    EXPECT_EQ(a[e]["train_loss"].get<double>(), b[e]["train_loss"].get<double>());
    EXPECT_EQ(a[e]["top1"].get<double>() * 20, b[e]["top1"].get<double>() * 20);
    EXPECT_EQ(a[e]["top5"].get<double>() * 20, b[e]["top5"].get<double>() * 20);
    const double la = a[e]["test_loss"], lb = b[e]["test_loss"];
    EXPECT_NEAR(la, lb, 1e-5 * std::abs(la));
  }
}

// Every rank's per-step cross entropies with the initial weights (lr 0 keeps them), computed here
// from the trainer's own data pipeline and model: sums and counts per step, for both ranks and
// for rank 0 alone.
struct StepLosses {
  std::vector<double> all_sum, all_n, rank0_sum, rank0_n;
};
StepLosses expected_step_losses(const std::string& dir, int64_t batch, uint64_t seed) {
  auto train_set = data::make_dataset("mnist", dir, true, {.augment = true, .seed = seed});
  auto model = nn::make_model({.name = "mlp",
                               .sample_shape = train_set->sample_shape(),
                               .num_classes = train_set->num_classes(),
                               .seed = seed});
  model->train();
  NoGradGuard no_grad;
  StepLosses s;
  for (int rank = 0; rank < 2; ++rank) {
    auto sampler = std::make_shared<data::DistributedSampler>(train_set->size(), 2, rank,
                                                              /*shuffle=*/true, seed);
    data::DataLoader loader(train_set, sampler, {.batch_size = batch, .workers = 0});
    loader.start_epoch(0);
    size_t step = 0;
    while (auto b = loader.next()) {
      const double n = double(b->targets.numel());
      const double l = cross_entropy(model->forward(b->inputs), b->targets).item() * n;
      if (s.all_sum.size() <= step) {
        s.all_sum.push_back(0), s.all_n.push_back(0), s.rank0_sum.push_back(0);
        s.rank0_n.push_back(0);
      }
      s.all_sum[step] += l, s.all_n[step] += n;
      if (rank == 0) s.rank0_sum[step] += l, s.rank0_n[step] += n;
      ++step;
    }
  }
  return s;
}

TEST_F(DeterminismAndMetrics, LoggedLossesAreMeansOverEveryRanksSamples) {
  // 200 samples, 100 per rank in batches of 32: steps of 32, 32, 32 and 4 samples per rank (the
  // short last batch must weigh less), each step its own progress line (fewer than 10 steps).
  const ProcessResult r =
      run_two_ranks("--model mlp --batch-size 32 --lr 0 --momentum 0 --metrics " + path("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const StepLosses s = expected_step_losses(dir_.string(), 32, 7);
  ASSERT_EQ(s.all_sum.size(), 4u);
  std::map<int, double> logged;
  const std::regex line(R"(epoch 1 step (\d+)/4 loss ([0-9.]+))");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), line), end; it != end; ++it) {
    logged[std::stoi((*it)[1])] = std::stod((*it)[2]);
  }
  ASSERT_EQ(logged.size(), 4u) << r.out;
  bool rank0_alone_differs = false;
  double sum = 0, n = 0;
  for (size_t i = 0; i < 4; ++i) {
    const double mean = s.all_sum[i] / s.all_n[i];
    EXPECT_NEAR(logged[int(i) + 1], mean, 1e-4) << "step " << i + 1 << "\n" << r.out;
    if (std::abs(s.rank0_sum[i] / s.rank0_n[i] - mean) > 5e-4) rank0_alone_differs = true;
    sum += s.all_sum[i];
    n += s.all_n[i];
  }
  EXPECT_TRUE(rank0_alone_differs) << "the data does not tell rank 0's loss from the mean";
  std::ifstream m(path("m.jsonl"));
  std::string first;
  std::getline(m, first);
  const nlohmann::json e = nlohmann::json::parse(first);
  ASSERT_EQ(e["type"], "epoch");
  EXPECT_NEAR(e["train_loss"].get<double>(), sum / n, 1e-5 * sum / n);
  EXPECT_EQ(n, 2.0 * 100);
}

}  // namespace
}  // namespace rg::app
