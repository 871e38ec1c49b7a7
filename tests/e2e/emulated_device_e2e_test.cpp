// ringgrad-train's --device cuda path end to end, on the emulated CUDA device of rg_engine_emu
// (rg_apps_common_emu): real MNIST batches copied to the device, the models' forward and
// backward, cross entropy, the fused optimizer steps and the evaluation's top-k counts all run
// the CUDA code paths (kernels under the emulator, GEMMs and convolutions through the emulated
// cuBLAS and cuDNN). The same runs on the CPU must reach the same accuracy.
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <map>
#include <sstream>

#include "apps/common/trainer.h"
#include "engine/serialization.h"
#include "engine/tf32.h"
#include "support/errors.h"
#include "support/idx_files.h"
#include "support/mnist_dir.h"
#include "support/scratch_dir.h"

namespace rg::app {
namespace {

TrainConfig mlp_config(const std::string& device) {
  TrainConfig c;
  c.model = "mlp";
  c.dataset = "mnist";
  c.data_dir = testing::mnist_dir();
  c.batch_size = 64;
  c.max_steps = 300;
  c.optimizer = "adam";
  c.lr = 1e-3;
  c.seed = 1;
  c.device = device;
  return c;
}

TEST(EmulatedDeviceE2E, MlpTrainsOnCudaLikeOnTheCpu) {
  std::ostringstream log_dev, log_cpu;
  const TrainResult dev = train(mlp_config("cuda"), log_dev);
  const TrainResult cpu = train(mlp_config("cpu"), log_cpu);
  EXPECT_NE(log_dev.str().find("on cuda:0"), std::string::npos) << log_dev.str();
  EXPECT_EQ(dev.total_steps, 300);
  EXPECT_GE(dev.final_top1, 0.90) << log_dev.str();
  // Same data, same initial weights: only summation orders differ.
  EXPECT_NEAR(dev.final_top1, cpu.final_top1, 0.005) << log_dev.str() << log_cpu.str();
  EXPECT_NEAR(dev.final_test_loss, cpu.final_test_loss, 0.01);
  std::cout << log_dev.str().substr(log_dev.str().rfind("epoch 1 |"));
}

// --cuda-graphs through ringgrad-train's configuration: AdamW under a cosine schedule, ToyNet's
// dropout included, replayed after the warm-up, ends with the eager run's test loss exactly.
TEST(EmulatedDeviceE2E, CudaGraphsTrainLikeEagerSteps) {
  TrainConfig c = mlp_config("cuda");
  c.model = "toynet";
  c.max_steps = 12;
  c.batch_size = 16;  // the capture and replay counts and the equality need no more
  c.optimizer = "adamw";
  c.lr_schedule = "cosine";
  c.eval_samples = 200;
  std::ostringstream eager_log, graph_log;
  const TrainResult eager = train(c, eager_log);
  c.cuda_graphs = true;
  const TrainResult graphed = train(c, graph_log);
  EXPECT_NE(graph_log.str().find("CUDA graphs: 1 capture(s), 10 replayed steps, 2 eager steps"),
            std::string::npos)
      << graph_log.str();
  EXPECT_EQ(graphed.final_test_loss, eager.final_test_loss) << graph_log.str();
  EXPECT_EQ(graphed.final_top1, eager.final_top1);
}

TEST(EmulatedDeviceE2E, ToyNetTrainsOnCudaLikeOnTheCpu) {
  // Convolutions through cuDNN (emulated), max pooling, dropout with the CPU's masks.
  TrainConfig c = mlp_config("cuda");
  c.model = "toynet";
  c.max_steps = 30;
  c.eval_samples = 2000;
  c.optimizer = "sgd";
  c.lr = 0.05;
  c.momentum = 0.9;
  std::ostringstream log_dev, log_cpu;
  const TrainResult dev = train(c, log_dev);
  c.device = "cpu";
  const TrainResult cpu = train(c, log_cpu);
  EXPECT_GE(dev.final_top1, 0.5) << log_dev.str();
  EXPECT_NEAR(dev.final_top1, cpu.final_top1, 0.01) << log_dev.str() << log_cpu.str();
  EXPECT_NEAR(dev.final_test_loss, cpu.final_test_loss, 0.02);
  std::cout << "toynet, 30 steps: top-1 " << dev.final_top1 << " on the emulated device, "
            << cpu.final_top1 << " on the CPU\n";
}

// --tf32: the run header says which f32 precision each kind of op gets, "on" really changes the
// MLP's products (TF32 GEMMs, emulated), and the process's switches are restored afterwards.
TEST(EmulatedDeviceE2E, Tf32FlagSetsTheRunsPrecisionAndIsRestored) {
  TrainConfig c = mlp_config("cuda");
  c.dataset = "synthetic";
  c.max_steps = 3;
  c.eval_samples = 500;  // evaluating 10k samples was 95% of these 3-step runs
  std::map<std::string, TrainResult> results;
  for (const std::string tf32 : {"default", "on", "off"}) {
    c.tf32 = tf32;
    std::ostringstream log;
    results[tf32] = train(c, log);
    const std::string header = "f32 precision on CUDA (--tf32 " + tf32 + "): convolutions " +
                               (tf32 == "off" ? "f32" : "TF32") + ", matrix products " +
                               (tf32 == "on" ? "TF32" : "f32");
    EXPECT_NE(log.str().find(header), std::string::npos) << log.str();
    EXPECT_TRUE(cuda::allow_tf32_conv()) << "restored after --tf32 " << tf32;
    EXPECT_FALSE(cuda::allow_tf32_matmul()) << "restored after --tf32 " << tf32;
  }
  // The MLP has no convolution: default and off are the same f32 run, on rounds its GEMMs.
  EXPECT_EQ(results["default"].final_test_loss, results["off"].final_test_loss);
  EXPECT_NE(results["on"].final_test_loss, results["default"].final_test_loss);
  EXPECT_NEAR(results["on"].final_test_loss, results["default"].final_test_loss, 0.01);
}

// --amp on the device: cuBLAS in f16 (with the GradScaler) or bf16 (emulated), autocast's f32
// losses; the CPU's f32 route of the same autocast reaches about the same accuracy (the half
// roundings of differently ordered sums make the runs drift apart, so not to the bit).
TEST(EmulatedDeviceE2E, MlpUnderAutocastTrainsOnCudaLikeOnTheCpu) {
  for (const std::string amp : {"bf16", "f16"}) {
    TrainConfig c = mlp_config("cuda");
    c.max_steps = 150;
    c.eval_samples = 2000;  // the same test images on both devices
    c.amp = amp;
    std::ostringstream log_dev, log_cpu;
    const TrainResult dev = train(c, log_dev);
    c.device = "cpu";
    const TrainResult cpu = train(c, log_cpu);
    EXPECT_GE(dev.final_top1, 0.88) << log_dev.str();
    EXPECT_NEAR(dev.final_top1, cpu.final_top1, 0.01) << amp << log_dev.str() << log_cpu.str();
    EXPECT_NEAR(dev.final_test_loss, cpu.final_test_loss, 0.03) << amp;
    std::cout << "mlp --amp " << amp << ", 150 steps: top-1 " << dev.final_top1
              << " on the emulated device, " << cpu.final_top1 << " on the CPU\n";
  }
}

TEST(EmulatedDeviceE2E, AnUnknownDeviceIsAClearError) {
  TrainConfig c = mlp_config("gpu");
  std::ostringstream log;
  testing::expect_error([&] { train(c, log); }, "unknown device 'gpu'");
}

// --deterministic on the emulated device: ToyNet (convolutions through the emulated cuDNN, max
// pooling, dropout) trained twice on small MNIST files this test writes (no real data needed)
// gives the same weights bit for bit; with --cudnn-benchmark too, the same again (f32 without
// TF32, where the emulated cuDNN's deterministic engines all compute alike).
class EmulatedDeviceDeterminism : public testing::ScratchDirTest {};

TEST_F(EmulatedDeviceDeterminism, TwoDeterministicRunsGiveTheSameWeights) {
  testing::write_small_mnist(dir_, 96, 32, 2);
  std::vector<SafetensorsFile> runs;
  for (int i = 0; i < 3; ++i) {
    TrainConfig c;
    c.model = "toynet";
    c.dataset = "mnist";
    c.data_dir = dir_.string();
    c.batch_size = 16;
    c.test_batch_size = 32;
    c.lr = 0.05;
    c.seed = 4;
    c.device = "cuda";
    c.deterministic = true;
    c.cudnn_benchmark = i == 2;
    // Full f32: with TF32 allowed, benchmark may time the emulated cuDNN's tensor-core engine
    // (TF32) faster than its FMA engine and round differently, as a real GPU may.
    c.tf32 = "off";
    c.checkpoint_path = (dir_ / ("run" + std::to_string(i) + ".safetensors")).string();
    std::ostringstream log;
    train(c, log);
    // Only the note that benchmark and bit-identical runs do not go together on real GPUs.
    EXPECT_EQ(log.str().find("note:") != std::string::npos, c.cudnn_benchmark) << log.str();
    runs.push_back(load_safetensors(c.checkpoint_path));
  }
  for (int i = 1; i < 3; ++i) {
    ASSERT_EQ(runs[0].tensors.size(), runs[size_t(i)].tensors.size());
    for (size_t t = 0; t < runs[0].tensors.size(); ++t) {
      const Tensor& a = runs[0].tensors[t].second;
      const Tensor& b = runs[size_t(i)].tensors[t].second;
      ASSERT_EQ(a.nbytes(), b.nbytes());
      EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), size_t(a.nbytes())), 0)
          << runs[0].tensors[t].first << " differs in run " << i;
    }
  }
}

}  // namespace
}  // namespace rg::app
