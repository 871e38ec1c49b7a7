// ringgrad-bench profile: per-op GPU time of a ringgrad-train --trace file (like torch.profiler's
// key_averages()): the spans on the CUDA stream lanes of the chosen steps, grouped by op, sorted
// by total time, with the host time of the trainer's phases per step. A GPU span counts in the
// step that queued it (its "queued_us" argument), wherever the GPU ran it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/trace_file.h"

namespace CLI {
class App;
}

namespace rg::apps {

struct ProfileOptions {
  std::string trace;
  std::string steps;  // "A:B" (0-based, B excluded), "A:", ":B" or "A"; empty: every step
  std::string csv;
  int rank = 0;
};

struct ProfileRow {
  std::string name, category;
  int64_t calls = 0;
  double total_us = 0;
  double mean_us() const { return calls > 0 ? total_us / double(calls) : 0; }
};

struct Profile {
  std::string file;
  int rank = 0;
  int first_step = 0, end_step = 0;  // the steps [first_step, end_step)
  int traced_steps = 0;
  std::vector<ProfileRow> ops;   // GPU spans by op, by total time (descending)
  std::vector<ProfileRow> host;  // the trainer's phases on the host, by total time
  // Host-blocking calls ("host stall" instants: synchronizations, pageable copies, device-to-host
  // reads) by call; recorded by the emulated runtime only (engine/cuda/backend.h).
  std::vector<ProfileRow> stalls;
  int64_t stall_calls = 0;
  // cuDNN descriptors created ("cudnn descriptor" instants), by creating function and type;
  // reported by the emulated cuDNN only. descriptor_calls leaves out the graph API's variant packs
  // (variant_pack_calls): the per-call bundles of a plan's pointers, reused only for pointer sets
  // seen before (kernels/cuda/conv2d_graph.cu).
  std::vector<ProfileRow> descriptors;
  int64_t descriptor_calls = 0;
  int64_t variant_pack_calls = 0;
  // Layout conversions between memory formats on the GPU ("layout conversion" instants, recorded
  // by Tensor::contiguous on a CUDA device, any runtime): 0 per step in a channels_last model.
  std::vector<ProfileRow> conversions;
  int64_t conversion_calls = 0;
  double gpu_us = 0;   // all GPU spans of the steps together
  double host_us = 0;  // the steps' wall time (forward to next forward)
  int steps() const { return end_step - first_step; }
};

// The steps [first, end) that `spec` names among `traced` steps; rg::Error when malformed or out
// of range.
std::pair<int, int> parse_step_range(const std::string& spec, int traced);
// The op of a span: its name without the module scope ("layer1.0.conv1: conv2d" -> "conv2d"); a
// collective's name without its details ("all_reduce f32[1024] ..." -> "all_reduce").
std::string op_of(const TraceEvent& e);
// rg::Error (naming the file) for a rank not in the trace, a trace without steps or without GPU
// spans in the chosen steps.
Profile compute_profile(const Trace& trace, int rank, const std::string& steps);
std::string profile_table(const Profile& p);
// op,category,calls,total_us,us_per_step,mean_us,share: the rows of the GPU table.
std::string profile_csv(const Profile& p);

CLI::App* add_profile_command(CLI::App& app, ProfileOptions& o);
// Exit code 2 for a missing or malformed trace, a trace without GPU spans or steps out of range.
int run_profile(const ProfileOptions& o);

}  // namespace rg::apps
