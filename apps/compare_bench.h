// ringgrad-bench compare: one model trained as a single device, DataParallel and
// DistributedDataParallel with the same global batch, schedule and seed, each mode a real
// ringgrad-train run (ddp under ringgrad-run), summarized in one table (mode, devices, global
// batch, top-1, top-5, img/s, peak memory per device, time to accuracy) and a PNG of top-1 per
// epoch. Where the modes run: on GPUs when the process sees enough; without GPUs single and ddp
// run on the CPU and dp on emulated devices (ringgrad-train-emu); `--device emulated` puts every
// mode on emulated devices (ddp with the emulated NCCL).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace rg::apps {

struct CompareOptions {
  std::string model = "resnet18";
  std::string dataset = "synthetic-cifar";
  std::string data_dir;
  std::vector<std::string> modes = {"single", "dp", "ddp"};
  int epochs = 1;
  int devices = 2;            // dp's devices and ddp's ranks
  int64_t global_batch = 64;  // single's batch; dp splits it; ddp runs global / devices per rank
  int64_t max_steps = -1;     // per run, for a quick look (-1: every epoch in full)
  std::string optimizer = "sgd";
  double lr = 0.05;
  std::string lr_schedule = "cosine";
  uint64_t seed = 1;
  int workers = 1;
  std::string device = "auto";  // auto | cpu | cuda | emulated
  double target_top1 = 0;       // time to accuracy; 0: the lowest final top-1 of the modes
  std::string plot;             // PNG of top-1 per epoch
  std::string csv;
  std::string work_dir;  // the runs' metrics and logs (default: a new directory under /tmp)
};

CLI::App* add_compare_command(CLI::App& app, CompareOptions& o);
int run_compare(const CompareOptions& o);

}  // namespace rg::apps
