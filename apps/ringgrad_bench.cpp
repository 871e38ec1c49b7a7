// ringgrad-bench: end-to-end benchmarks.
//   train: training throughput (img/s, tok/s for gpt-*) of a model on synthetic data after
//          warm-up, as the median of several timed windows, with peak memory, on the CPU or a
//          CUDA device; --ddp under ringgrad-run: the job's total throughput with
//          DistributedDataParallel (scripts/bench-vs-pytorch.sh) (apps/train_bench.h).
//   allreduce: all-reduce bandwidth over a size sweep (apps/allreduce_bench.h).
//   overlap: DDP all-reduce/backward overlap across bucket sizes (apps/overlap_bench.h).
//   timeline: draws one step of a ringgrad-train --trace file (apps/timeline_plot.h).
//   flight: what the ranks' flight recorder dumps say happened (apps/flight_analyzer.h).
//   compare: single device, DataParallel and DDP on one model (apps/compare_bench.h).
//   scale: predicted step time and scaling efficiency at 1-1024 GPUs (apps/scale_sim.h).
//   profile: per-op GPU time per step of a ringgrad-train --trace file (apps/profile_table.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "apps/allreduce_bench.h"
#include "apps/compare_bench.h"
#include "apps/flight_analyzer.h"
#include "apps/overlap_bench.h"
#include "apps/profile_table.h"
#include "apps/scale_sim.h"
#include "apps/timeline_plot.h"
#include "apps/train_bench.h"
#include "comm/sim_link.h"
#include "kernels/cpu/runtime_env.h"
#include "kernels/error.h"

// Every subcommand's flags (the add_*_command functions declared in each command's header) are
// defined here, in the one file of ringgrad-bench that includes CLI11: CLI11 2.1.2 is header-only
// and each file including it compiles its validators and parser again (~6.6 s at -O3, ~15 s in
// the sanitized fuzz build, g++ 12), so the commands' own sources stay free of it.
namespace rg::apps {

CLI::App* add_train_command(CLI::App& app, TrainBenchOptions& t) {
  CLI::App* train = app.add_subcommand(
      "train",
      "training throughput on synthetic data (median of timed windows after warm-up; on CUDA the "
      "device is synchronized at each window's ends)");
  train->option_defaults()->always_capture_default();
  train->add_option("--model", t.model,
                    "toynet | mlp | resnet18 | gpt-nano | gpt-micro | gpt-mini");
  train->add_option("--batch-size", t.batch_size)->check(CLI::PositiveNumber);
  train->add_option("--block-size", t.block_size, "gpt-*: tokens per sample")
      ->check(CLI::PositiveNumber);
  train->add_option("--vocab-size", t.vocab_size, "gpt-*: random token ids in [0, N)")
      ->check(CLI::PositiveNumber);
  train->add_option("--device", t.device, "cpu | cuda | cuda:N");
  train->add_option("--amp", t.amp, "off | bf16 | f16 (autocast; f16 with a GradScaler)")
      ->check(CLI::IsMember({"off", "bf16", "f16"}));
  train->add_option("--threads", t.threads, "compute threads (default: all cores)");
  train->add_option("--warmup", t.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  train->add_option("--windows", t.windows, "timed windows (the median is reported)")
      ->check(CLI::PositiveNumber);
  train->add_option("--window-steps", t.window_steps, "steps per window")
      ->check(CLI::PositiveNumber);
  train->add_flag("--ddp", t.ddp,
                  "DistributedDataParallel over Gloo (CPU) or NCCL (CUDA: each rank on its group's "
                  "GPU); run under ringgrad-run (reports the job's total img/s)");
  train
      ->add_option("--deferred-checks", t.deferred_checks,
                   "CUDA: read the ops' device-side input checks once per window (true) or at "
                   "each op, stalling the host (false)")
      ->default_val(true);
  train->add_flag("--cudnn-benchmark", t.cudnn_benchmark,
                  "CUDA: time cuDNN's convolution algorithms once per shape and take the fastest "
                  "(torch.backends.cudnn.benchmark)");
  train
      ->add_option("--cudnn-conv-api", t.cudnn_conv_api,
                   "CUDA: the cuDNN API of the convolutions: graph (its engines, as PyTorch; the "
                   "legacy API where it has none) or legacy (for comparison)")
      ->check(CLI::IsMember({"graph", "legacy"}));
  train
      ->add_option("--cudnn", t.cudnn,
                   "CUDA: batch norm and average pooling through cuDNN (true) or our kernels "
                   "(false; convolutions always use cuDNN)")
      ->default_val(true);
  train
      ->add_option("--fuse-bn-relu", t.fuse_bn_relu,
                   "ResNet: each BatchNorm2d followed by ReLU as one fused op (true) or two")
      ->default_val(true);
  train->add_flag("--cuda-graphs", t.cuda_graphs,
                  "CUDA: capture forward, backward and the optimizer step as one CUDA graph after "
                  "2 warm-up steps and replay it");
  train->add_flag("--channels-last", t.channels_last,
                  "the model's 4-d weights and the batches channels last (NHWC, as PyTorch's "
                  "torch.channels_last)");
  train->add_option("--json", t.json_path,
                    "also write the figures (windows' rates, median, peak memory) to FILE as JSON");
  return train;
}

CLI::App* add_allreduce_command(CLI::App& app, AllreduceBenchOptions& o) {
  CLI::App* c = app.add_subcommand(
      "allreduce", "all-reduce bandwidth over a size sweep (run under ringgrad-run)");
  c->option_defaults()->always_capture_default();
  c->add_option("--algorithms", o.algorithms,
                "gloo-native, gloo-ring, gloo-shm (every rank on one host), nccl-native, "
                "nccl-ring (nccl-* need a GPU)")
      ->delimiter(',');
  c->add_option("--min-bytes", o.min_bytes, "smallest message (4, 64K, 16M, ...)");
  c->add_option("--max-bytes", o.max_bytes, "largest message");
  c->add_option("--step-factor", o.step_factor, "size multiplier between rows")
      ->check(CLI::Range(2, 1024));
  c->add_option("--dtype", o.dtype, "f32 | f64 | f16 | bf16 | i64");
  c->add_option("--iters", o.iters,
                "timed iterations per size (0: 200 for small messages "
                "down to 5 for large ones)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--warmup", o.warmup, "untimed iterations per size")->check(CLI::NonNegativeNumber);
  c->add_option("--chunk-kib", o.chunk_kib, "ring pipelining chunk (KiB)")
      ->check(CLI::PositiveNumber);
  c->add_option("--shm-chunk-kib", o.shm_chunk_kib, "shared-memory collectives chunk (KiB)")
      ->check(CLI::PositiveNumber);
  c->add_option("--csv", o.csv, "also write the rows as CSV to this file");
  c->add_option("--plot", o.plot, "also plot busbw against size to this PNG (needs gnuplot)");
  return c;
}

CLI::App* add_overlap_command(CLI::App& app, OverlapBenchOptions& o) {
  CLI::App* c = app.add_subcommand(
      "overlap", "DDP all-reduce/backward overlap across bucket sizes (run under ringgrad-run)");
  c->option_defaults()->always_capture_default();
  c->add_option("--model", o.models,
                "models to run (toynet, mlp, resnet18, gpt-nano, gpt-micro, gpt-mini)")
      ->delimiter(',');
  c->add_option("--block-size", o.block_size, "gpt-*: tokens per sample (random ids)")
      ->check(CLI::PositiveNumber);
  c->add_option("--bucket-mb", o.bucket_mb,
                "bucket caps in MiB; 'inf' = no cap (1 MiB first bucket kept); 'single' = one "
                "bucket")
      ->delimiter(',');
  c->add_option("--batch-size", o.batch_size,
                "per rank (0: 64 for toynet/mlp, 16 for resnet18 and gpt-*)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--warmup", o.warmup,
                "untimed iterations per configuration (>= 2: the "
                "buckets are rebuilt after the first)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--iters", o.iters, "timed iterations per configuration")
      ->check(CLI::PositiveNumber);
  c->add_option("--sim-link", o.sim_link,
                "GBPS,LATENCY_US (or 450GBps,2us) or a preset: all-reduces take the time of such "
                "a link (latency + 2(n-1)/n x bytes / bandwidth) and move no data. Presets:\n" +
                    dist::sim_link_presets_help());
  c->add_option("--sim-ranks", o.sim_ranks,
                "with --sim-link: the ranks the modelled ring spans (default: the job's; needed "
                "with one process)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--device", o.device,
                "cpu (gloo) or cuda: the model on the GPU, over NCCL with one process per GPU, "
                "or with --sim-link on one GPU with modelled transfers on the NCCL stream")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  c->add_option("--trace", o.trace,
                "write a Chrome trace of the timed DDP iterations (CUDA: GPU spans; the modelled "
                "transfers on the NCCL stream's lane)");
  c->add_option("--plot", o.plot,
                "write a PNG per model: iteration time against the mean bucket size, overlapped "
                "and not ('{model}' in the path: the model's name)");
  c->add_option("--allreduce", o.allreduce, "auto | native | ring | shm (real all-reduces)");
  c->add_option("--csv", o.csv, "also write the rows as CSV to this file");
  c->add_option("--stat", o.stat,
                "median of the timed iterations, or min: the fastest (steadier on a busy "
                "machine)")
      ->check(CLI::IsMember({"median", "min"}));
  c->add_option("--profile-out", o.profile_out,
                "write each model's step profile for ringgrad-bench scale ('{model}' in the path: "
                "the model's name; '{bucket}': one per bucket cap, sampled between its DDP "
                "iterations)");
  return c;
}

CLI::App* add_compare_command(CLI::App& app, CompareOptions& o) {
  CLI::App* c = app.add_subcommand(
      "compare", "single device, DataParallel and DDP on one model: one table and a plot");
  c->option_defaults()->always_capture_default();
  c->add_option("--model", o.model, "model (toynet, mlp, resnet18, ...)");
  c->add_option("--dataset", o.dataset, "dataset (cifar100, synthetic-cifar, mnist, ...)");
  c->add_option("--data-dir", o.data_dir, "dataset directory (default: data/<dataset>)");
  c->add_option("--modes", o.modes, "modes to run, in order")
      ->delimiter(',')
      ->check(CLI::IsMember({"single", "dp", "ddp"}));
  c->add_option("--epochs", o.epochs, "epochs per mode")->check(CLI::PositiveNumber);
  c->add_option("--devices", o.devices, "dp's devices and ddp's ranks")->check(CLI::Range(2, 64));
  c->add_option("--global-batch", o.global_batch,
                "the batch of one optimizer step in every mode (ddp: global / devices per rank)")
      ->check(CLI::PositiveNumber);
  c->add_option("--max-steps", o.max_steps, "stop each run after N steps (a quick look)");
  c->add_option("--optimizer", o.optimizer, "as ringgrad-train's");
  c->add_option("--lr", o.lr, "learning rate");
  c->add_option("--lr-schedule", o.lr_schedule, "as ringgrad-train's");
  c->add_option("--seed", o.seed, "seed of every run");
  c->add_option("--workers", o.workers, "data loader threads per process");
  c->add_option("--device", o.device,
                "auto (GPUs if seen, else the CPU and emulated devices for dp) | cpu | cuda | "
                "emulated (every mode on emulated devices)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda", "emulated"}));
  c->add_option("--target-top1", o.target_top1,
                "top-1 (0-1) for the time-to-accuracy column (0: the lowest final top-1)");
  c->add_option("--plot", o.plot, "PNG of top-1 per epoch per mode (needs gnuplot)");
  c->add_option("--csv", o.csv, "also write the table as CSV");
  c->add_option("--work-dir", o.work_dir, "where the runs' metrics and logs go");
  return c;
}

CLI::App* add_timeline_command(CLI::App& app, TimelineOptions& o) {
  CLI::App* c = app.add_subcommand("timeline", "draw one step of a ringgrad-train --trace file");
  c->option_defaults()->always_capture_default();
  c->add_option("trace", o.trace, "trace JSON written by ringgrad-train --trace")->required();
  c->add_option("--out", o.out, "PNG to write");
  c->add_option("--step", o.step, "which traced step to draw (0-based)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--title", o.title, "picture title");
  return c;
}

CLI::App* add_profile_command(CLI::App& app, ProfileOptions& o) {
  CLI::App* c = app.add_subcommand(
      "profile",
      "per-op GPU time per step of a ringgrad-train --trace file (exit code 2: a bad "
      "file or range)");
  c->option_defaults()->always_capture_default();
  c->add_option("trace", o.trace, "trace JSON written by ringgrad-train --device cuda --trace")
      ->required();
  c->add_option("--steps", o.steps,
                "traced steps A:B (0-based, B excluded; A:, :B or A too; default: all)");
  c->add_option("--rank", o.rank, "which rank of the trace")->check(CLI::NonNegativeNumber);
  c->add_option("--csv", o.csv, "also write the GPU table's rows to this CSV file");
  return c;
}

namespace scale {

CLI::App* add_scale_command(CLI::App& app, ScaleOptions& o) {
  CLI::App* c = app.add_subcommand(
      "scale",
      "predict DDP step time and scaling efficiency at 1-1024 GPUs from a measured step "
      "(exit code 2: a missing or malformed input)");
  c->option_defaults()->always_capture_default();
  c->add_option("--trace", o.traces,
                "step profiles (ringgrad-bench overlap --profile-out) or ringgrad-train --trace "
                "files of a DDP run")
      ->required()
      ->delimiter(',');
  c->add_option("--preset", o.presets, "dgx-a100, v100-ib, ethernet-10g")->delimiter(',');
  c->add_option("--sim-link", o.sim_link,
                "GBPS,LATENCY_US or a link preset: comm/sim_link's flat link instead of the "
                "cluster presets (to validate against ringgrad-bench overlap --sim-link). Link "
                "presets:\n" +
                    dist::sim_link_presets_help());
  c->add_option("--gpus", o.gpus, "GPU counts")->delimiter(',')->check(CLI::PositiveNumber);
  c->add_option("--bucket-mb", o.bucket_mb,
                "bucket caps in MiB; 'inf' = no cap (1 MiB first bucket kept); 'single' = one "
                "bucket")
      ->delimiter(',');
  c->add_option("--algo", o.algo, "ring | tree | best (the faster per all-reduce)");
  c->add_option("--gpus-per-node", o.gpus_per_node, "override the preset's (0: keep)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--launch-us", o.launch_us,
                "fixed cost per all-reduce in microseconds (launch, DDP's bucket handling)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--compute-scale", o.compute_scale,
                "multiply every measured compute time by this (e.g. a GPU's speed-up)")
      ->check(CLI::PositiveNumber);
  c->add_option("--step", o.step, "which traced step of a --trace file (-1: the last complete)");
  c->add_option("--rank", o.rank, "which rank of a --trace file")->check(CLI::NonNegativeNumber);
  c->add_option("--csv", o.csv, "also write every prediction as CSV to this file");
  c->add_option("--plot", o.plot, "PNG of efficiency (best bucket) against GPU count (gnuplot)");
  c->add_option("--profile-out", o.profile_out,
                "write the step profile read from the first --trace (e.g. to convert a trace)");
  return c;
}

}  // namespace scale
}  // namespace rg::apps

namespace {

// After an error the command's own files are closed (their streams unwound) and the message is
// out; the process leaves without running the libraries' exit handlers: OpenBLAS 0.3.21's
// (blas_thread_shutdown_) was seen to wait forever for its server thread when the exit came
// from an error in the middle of an emulated CUDA run (2 runs of 4).
[[noreturn]] void exit_after_error(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  rg::kernels::cpu::ensure_runtime_env(argc, argv);
  CLI::App app{"ringgrad-bench: end-to-end benchmarks"};
  app.require_subcommand(1);
  rg::apps::TrainBenchOptions t;
  CLI::App* train = rg::apps::add_train_command(app, t);
  rg::apps::AllreduceBenchOptions ar;
  CLI::App* allreduce = rg::apps::add_allreduce_command(app, ar);
  rg::apps::OverlapBenchOptions ov;
  CLI::App* overlap = rg::apps::add_overlap_command(app, ov);
  rg::apps::CompareOptions cmp;
  CLI::App* compare = rg::apps::add_compare_command(app, cmp);
  rg::apps::TimelineOptions tl;
  CLI::App* timeline = rg::apps::add_timeline_command(app, tl);
  rg::apps::scale::ScaleOptions sc;
  CLI::App* scale = rg::apps::scale::add_scale_command(app, sc);
  rg::apps::ProfileOptions pf;
  CLI::App* profile = rg::apps::add_profile_command(app, pf);
  std::vector<std::string> flight_files;
  CLI::App* flight = app.add_subcommand(
      "flight", "what the ranks' flight recorder dumps say happened (exit code 2: a bad file)");
  flight
      ->add_option("files", flight_files,
                   "every rank's dump (rank*.json, e.g. DIR/rank*.json), or their directory")
      ->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "ringgrad-bench: " << e.what() << "\nRun with --help for usage.\n";
    return 2;
  }
  try {
    if (train->parsed()) return rg::apps::run_train_bench(t);
    if (allreduce->parsed()) return rg::apps::run_allreduce_bench(ar);
    if (overlap->parsed()) return rg::apps::run_overlap_bench(ov);
    if (compare->parsed()) return rg::apps::run_compare(cmp);
    if (timeline->parsed()) return rg::apps::run_timeline(tl);
    if (flight->parsed()) return rg::apps::run_flight(flight_files);
    if (scale->parsed()) return rg::apps::scale::run_scale(sc);
    if (profile->parsed()) return rg::apps::run_profile(pf);
  } catch (const rg::InternalError& e) {  // a bug in ringgrad: EX_SOFTWARE
    std::cerr << "ringgrad-bench: " << e.what() << std::endl;
    exit_after_error(70);
  } catch (const rg::Error& e) {
    std::cerr << "ringgrad-bench: error: " << e.what() << std::endl;
    exit_after_error(1);
  }
  return 0;
}
