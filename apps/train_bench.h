// ringgrad-bench train: training throughput in steady state (the median rate of timed windows
// after warm-up) of one model on fixed synthetic batches, on the CPU or a CUDA device, with peak
// memory. bench/pytorch/train_bench.py is PyTorch's side of it (same models, batches, optimizer,
// windows and summary line).
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace rg::apps {

struct TrainBenchOptions {
  std::string model = "toynet";  // toynet | mlp | resnet18 | gpt-nano | gpt-micro | gpt-mini
  int64_t batch_size = 64;
  int64_t block_size = 128;  // gpt-*: tokens per sample
  int64_t vocab_size = 65;   // gpt-*: synthetic token ids in [0, vocab_size)
  std::string device = "cpu";
  int threads = 0;
  int warmup = 5;
  int windows = 5;
  int window_steps = 10;
  bool ddp = false;
  std::string amp = "off";  // off | bf16 | f16: autocast of forward and loss (f16: GradScaler)
  std::string json_path;    // the figures as one JSON object, when set
  // CUDA: the ops' device-side input checks (cross_entropy's targets) are read back once per
  // window (engine/device_checks.h) instead of once per op call, which stalls the host.
  bool deferred_checks = true;
  bool cudnn_benchmark = false;          // rg::set_cudnn_benchmark (torch.backends.cudnn.benchmark)
  std::string cudnn_conv_api = "graph";  // rg::set_cudnn_conv_api: graph | legacy
  bool cudnn = true;                     // rg::set_cudnn_enabled: off, batch norm runs our kernels
  bool fuse_bn_relu = true;              // nn::set_batch_norm_relu_fusion
  bool cuda_graphs = false;              // train::GraphStep: each step after the warm-up one replay
  bool channels_last = false;            // Module::to(MemoryFormat::channels_last) and NHWC batches
};

CLI::App* add_train_command(CLI::App& app, TrainBenchOptions& o);
int run_train_bench(const TrainBenchOptions& o);

}  // namespace rg::apps
