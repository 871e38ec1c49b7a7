// ringgrad-bench scale: predicts DDP's step time, exposed communication and scaling efficiency
// at 1 to 1024 GPUs from one measured step (a "step profile"), under a two-level link model
// (inside a node, between nodes) with ring and tree all-reduce, for every bucket size, and
// recommends one.
//
// The step profile (JSON, written by `ringgrad-bench overlap --profile-out`, or derived from a
// `ringgrad-train --trace` file):
//   {"format": "ringgrad-step-profile", "version": 1, "model": "resnet18",
//    "source": "how it was measured", "measured_ranks": 2,
//    "forward_ms": 120.5, "backward_ms": 250.0, "optimizer_ms": 8.0,
//    "grads": [{"name": "fc.weight", "bytes": 20480, "ready_ms": 3.1}, ...]}
// forward_ms holds everything before backward (zero_grad, forward, loss); ready_ms is when a
// gradient became final, relative to the start of backward; "grads" lists single parameters
// ("granularity": "parameter") or, from a trace, whole DDP buckets ("granularity": "bucket").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/sim_link.h"

namespace CLI {
class App;
}

namespace rg::apps::scale {

struct Grad {
  std::string name;
  int64_t bytes = 0;
  double ready_ms = 0;
};

struct StepProfile {
  std::string model, source;
  int measured_ranks = 1;
  double forward_ms = 0, backward_ms = 0, optimizer_ms = 0;
  bool per_parameter = true;  // false: each Grad is a measured DDP bucket
  std::vector<Grad> grads;    // sorted by ready_ms
  int64_t total_bytes() const;
};

// Parses a step profile (`file` names it in errors); rg::Error saying what is wrong otherwise.
StepProfile parse_step_profile(const std::string& text, const std::string& file);
// The step-th traced step (0-based, rank 0's numbering) of rank `rank` in a ringgrad-train
// --trace file: forward, backward up to DDP's final wait, optimizer, and each bucket's size and
// ready time. A negative step means the last complete one.
StepProfile profile_from_trace(const std::string& text, const std::string& file, int step,
                               int rank);
// Either format, told apart by its content; a missing file is an rg::Error.
StepProfile read_profile(const std::string& path, int step, int rank);
// What read_profile does with the file's text (`file` names it): the fuzzer's entry.
StepProfile profile_from_text(const std::string& text, const std::string& file, int step, int rank);
std::string step_profile_json(const StepProfile& p);

// One level of the network, per GPU and direction.
struct Level {
  double gbps = 1;  // GB/s (1e9 B/s)
  double latency_us = 5;
};

struct Cluster {
  std::string name;
  int gpus_per_node = 8;
  Level intra;  // bandwidth per GPU
  Level inter;  // bandwidth per node (all its NICs together)
  // comm/sim_link's flat link: one latency per collective, ring bandwidth term, no nodes.
  bool sim_link = false;
  // A fixed cost per all-reduce on top of the link (kernel launch, DDP's handling of a bucket):
  // what makes many small buckets slower than a few large ones. 0 in the presets.
  double launch_us = 0;
};

// dgx-a100, v100-ib, ethernet-10g (sources in scale_sim.cpp); rg::Error for another name.
Cluster preset(const std::string& name);
Cluster sim_link_cluster(const dist::SimLink& link);

enum class Algo { ring, tree, best };
Algo parse_algo(const std::string& s);
const char* algo_name(Algo a);

// Microseconds for one all-reduce of `bytes` among n ranks over one level.
double ring_allreduce_us(double bytes, int n, const Level& l);
double tree_allreduce_us(double bytes, int n, const Level& l);
// The whole cluster: flat inside one node, hierarchical beyond (see scale_sim.cpp).
double allreduce_us(double bytes, int n, const Cluster& c, Algo algo);

struct Bucket {
  int64_t bytes = 0;
  double ready_ms = 0;
};
// DDP's buckets for a cap (MiB; <= 0: one bucket) with a first bucket of first_mb, filled in
// ready order. Per-parameter profiles keep parameters whole (as DDP); bucket-level profiles are
// cut into pieces whose bytes are spread evenly in time between consecutive ready instants.
std::vector<Bucket> rebucket(const StepProfile& p, double cap_mb, double first_mb);

struct Prediction {
  double step_ms = 0, compute_ms = 0, comm_ms = 0, exposed_ms = 0;
  size_t buckets = 0;
};
// In order on one stream, as DDP's Reducer: bucket k starts at max(ready_k, end of bucket k-1);
// exposed = last end - backward end (if positive); step = forward + max(backward end, last end)
// + optimizer. comm_us[k] is bucket k's all-reduce time.
Prediction simulate_overlap(double forward_ms, double backward_ms, double optimizer_ms,
                            const std::vector<Bucket>& buckets, const std::vector<double>& comm_us);

struct ScaleOptions {
  std::vector<std::string> traces;
  std::vector<std::string> presets = {"dgx-a100", "v100-ib", "ethernet-10g"};
  std::string sim_link;  // "GBPS,LATENCY_US": replaces the presets
  std::vector<int> gpus = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  std::vector<std::string> bucket_mb = {"1", "5", "10", "25", "50", "100", "single"};
  std::string algo = "best";
  int gpus_per_node = 0;  // 0: the preset's
  double compute_scale = 1.0;
  double launch_us = 0;
  int step = -1, rank = 0;
  std::string csv, plot, profile_out;
};

CLI::App* add_scale_command(CLI::App& app, ScaleOptions& o);
// Exit code 2 for a missing or malformed input, as `ringgrad-bench flight`.
int run_scale(const ScaleOptions& o);

}  // namespace rg::apps::scale
