// ringgrad-bench overlap: DDP iteration time across bucket sizes with and without overlapping
// the all-reduces with backward, split into compute, communication and exposed communication.
// Run it under ringgrad-run; --sim-link studies a slower network on one machine. --device cuda:
// the model on the GPU, over NCCL (one process per GPU), or with --sim-link (one GPU is enough)
// each bucket's all-reduce a modelled transfer of the link's time on the NCCL stream among
// --sim-ranks ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace rg::apps {

struct OverlapBenchOptions {
  std::vector<std::string> models = {"toynet", "resnet18"};
  // MiB caps; "inf": no cap (only DDP's 1 MiB first bucket is separate); "single": one bucket.
  std::vector<std::string> bucket_mb = {"1", "5", "10", "25", "50", "inf", "single"};
  int64_t batch_size = 0;  // per rank; 0: 64 for toynet/mlp, 16 for resnet18 and gpt-*
  int64_t block_size = 128;  // gpt-*: tokens per sample
  int warmup = 2;
  int iters = 5;
  std::string sim_link;  // "GBPS,LATENCY_US"
  std::string allreduce = "native";
  std::string csv;
  // "median" of the timed iterations, or "min": the fastest iteration (with its communication
  // and exposed time), which a machine shared with other work slows down least.
  std::string stat = "median";
  // Where to write each model's step profile (apps/scale_sim.h) for ringgrad-bench scale: an
  // iteration (with a link model: DDP on a free link; else compute-only) split into forward,
  // backward (with each parameter's gradient-ready time) and optimizer, averaged over ranks. "{model}" in the path is replaced by the model;
  // with "{bucket}", one profile per bucket cap, sampled between its overlapped DDP iterations.
  std::string profile_out;
  std::string device = "cpu";  // cpu | cuda
  int sim_ranks = 0;           // the ranks the modelled link's ring spans; 0: the job's
  std::string trace;           // Chrome trace of the timed iterations (every rank's, as one file)
  std::string plot;            // PNG: iteration time against the bucket cap, per model
};

CLI::App* add_overlap_command(CLI::App& app, OverlapBenchOptions& o);
int run_overlap_bench(const OverlapBenchOptions& o);

}  // namespace rg::apps
