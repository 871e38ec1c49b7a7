// ringgrad-train's --device cuda path end to end, on the emulated CUDA device of rg_engine_emu
// (rg_apps_common_emu): real MNIST batches copied to the device, the MLP's forward and backward,
// cross entropy, the fused Adam step and the evaluation's top-k counts all run the CUDA code
// paths (kernels under the emulator, GEMMs through the emulated cuBLAS). The same run on the CPU
// must reach the same accuracy.
#include <gtest/gtest.h>

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

TEST(EmulatedDeviceE2E, ConvolutionalModelsSayConv2dIsNotOnCudaYet) {
  TrainConfig c = mlp_config("cuda");
  c.model = "toynet";
  c.max_steps = 1;
  std::ostringstream log;
  testing::expect_error([&] { train(c, log); }, "conv2d: not implemented on CUDA yet");
  c.device = "gpu";
  testing::expect_error([&] { train(c, log); }, "unknown device 'gpu'");
}

}  // namespace
}  // namespace rg::app
