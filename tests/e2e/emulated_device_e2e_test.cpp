// ringgrad-train's --device cuda path end to end, on the emulated CUDA device of rg_engine_emu
// (rg_apps_common_emu): real MNIST batches copied to the device, the models' forward and
// backward, cross entropy, the fused optimizer steps and the evaluation's top-k counts all run
// the CUDA code paths (kernels under the emulator, GEMMs and convolutions through the emulated
// cuBLAS and cuDNN). The same runs on the CPU must reach the same accuracy.
#include <gtest/gtest.h>

#include <iostream>
#include <sstream>

#include "apps/common/trainer.h"
#include "support/errors.h"
#include "support/mnist_dir.h"

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

TEST(EmulatedDeviceE2E, ToyNetTrainsOnCudaLikeOnTheCpu) {
  // Convolutions through cuDNN (emulated), max pooling, dropout with the CPU's masks.
  TrainConfig c = mlp_config("cuda");
  c.model = "toynet";
  c.max_steps = 30;
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

// --amp on the device: cuBLAS in f16 (with the GradScaler) or bf16 (emulated), autocast's f32
// losses; the CPU's f32 route of the same autocast reaches about the same accuracy (the half
// roundings of differently ordered sums make the runs drift apart, so not to the bit).
TEST(EmulatedDeviceE2E, MlpUnderAutocastTrainsOnCudaLikeOnTheCpu) {
  for (const std::string amp : {"bf16", "f16"}) {
    TrainConfig c = mlp_config("cuda");
    c.max_steps = 150;
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

}  // namespace
}  // namespace rg::app
