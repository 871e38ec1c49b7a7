// ringgrad-bench: end-to-end benchmarks.
//   train: training throughput (img/s) of a model on synthetic data after warm-up, as the median
//          of several timed windows, with peak memory; --ddp under ringgrad-run: the job's
//          total throughput with DistributedDataParallel (scripts/bench-vs-pytorch.sh).
//   allreduce: all-reduce bandwidth over a size sweep (apps/allreduce_bench.h).
//   overlap: DDP all-reduce/backward overlap across bucket sizes (apps/overlap_bench.h).
//   timeline: draws one step of a ringgrad-train --trace file (apps/timeline_plot.h).
//   flight: what the ranks' flight recorder dumps say happened (apps/flight_analyzer.h).
//   compare: single device, DataParallel and DDP on one model (apps/compare_bench.h).
//   scale: predicted step time and scaling efficiency at 1-1024 GPUs (apps/scale_sim.h).
//   profile: per-op GPU time per step of a ringgrad-train --trace file (apps/profile_table.h).
#include <fmt/format.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

#include "apps/allreduce_bench.h"
#include "apps/compare_bench.h"
#include "apps/flight_analyzer.h"
#include "apps/overlap_bench.h"
#include "apps/profile_table.h"
#include "apps/scale_sim.h"
#include "apps/timeline_plot.h"
#include "comm/ddp.h"
#include "comm/init.h"
#include "data/synthetic.h"
#include "engine/autocast.h"
#include "engine/ops/loss.h"
#include "engine/storage.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/runtime_env.h"
#include "kernels/error.h"
#include "layers/amp/grad_scaler.h"
#include "layers/models/registry.h"
#include "layers/optim/optimizer.h"

namespace {

struct TrainBenchOptions {
  std::string model = "toynet";
  int64_t batch_size = 64;
  int threads = 0;
  int warmup = 5;
  int windows = 5;
  int window_steps = 10;
  bool ddp = false;
  std::string amp = "off";  // off | bf16 | f16: autocast of forward and loss (f16: GradScaler)
};

int run_train_bench(const TrainBenchOptions& o) {
  if (o.threads > 0) rg::kernels::cpu::set_num_threads(o.threads);
  // With --ddp every rank trains on its own batches and the job's throughput is reported by
  // rank 0: world size x batch x steps over the window's time (DDP's all-reduces keep the ranks
  // in step, so rank 0's clock is the job's).
  std::shared_ptr<rg::dist::ProcessGroup> pg;
  if (o.ddp) {
    rg::dist::InitOptions init;
    init.backend = "gloo";
    pg = rg::dist::init_process_group(init);
  }
  const int rank = pg ? pg->rank() : 0;
  const int world = pg ? pg->size() : 1;
  const rg::Shape shape = o.model == "toynet" ? rg::Shape{1, 28, 28} : rg::Shape{3, 32, 32};
  rg::data::SyntheticDataset data(o.batch_size * 4, shape, 10, 7 + uint64_t(rank));
  auto model = rg::nn::make_model({.name = o.model, .sample_shape = shape, .num_classes = 10});
  model->train();
  std::unique_ptr<rg::dist::DistributedDataParallel> ddp;
  if (pg) ddp = std::make_unique<rg::dist::DistributedDataParallel>(model, pg);
  rg::optim::Sgd opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  // A few fixed batches, so the benchmark measures compute, not data loading.
  std::vector<rg::data::Batch> batches;
  for (int b = 0; b < 4; ++b) {
    std::vector<int64_t> idx(static_cast<size_t>(o.batch_size));
    for (int64_t i = 0; i < o.batch_size; ++i) idx[size_t(i)] = b * o.batch_size + i;
    batches.push_back(data.get_batch(idx, 0));
  }
  rg::amp::GradScalerOptions scaler_options;
  scaler_options.enabled = o.amp == "f16";
  rg::amp::GradScaler scaler(scaler_options);
  auto step = [&](int i) {
    const auto& b = batches[size_t(i % 4)];
    rg::Tensor loss;
    {
      const rg::AutocastGuard autocast(rg::Device::cpu(),
                                       o.amp == "off" ? rg::DType::bf16 : rg::parse_dtype(o.amp),
                                       o.amp != "off");
      rg::Tensor out = ddp ? ddp->forward(b.inputs) : model->forward(b.inputs);
      loss = rg::cross_entropy(out, b.targets);
    }
    opt.zero_grad();
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  };
  const bool print = rank == 0;
  if (print) {
    fmt::print("ringgrad-bench train: model={} amp={} batch={} threads={} params={} blas={}{}\n",
               o.model, o.amp, o.batch_size, rg::kernels::cpu::num_threads(),
               model->parameter_count(), rg::kernels::cpu::blas_core_name(),
               pg ? fmt::format(" ddp=gloo world={} (img/s of the whole job)", world) : "");
  }
  for (int i = 0; i < o.warmup; ++i) step(i);
  std::vector<double> rates;
  if (print) fmt::print("{:>8} {:>10} {:>10}\n", "window", "seconds", "img/s");
  for (int w = 0; w < o.windows; ++w) {
    if (pg) pg->barrier()->wait();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.window_steps; ++i) step(i);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(double(o.window_steps * o.batch_size * world) / s);
    if (print) fmt::print("{:>8} {:>10.3f} {:>10.1f}\n", w, s, rates.back());
  }
  std::sort(rates.begin(), rates.end());
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const auto mem = rg::cpu_memory_stats();
  if (print) {
    fmt::print(
        "median {:.1f} img/s | peak RSS {:.0f} MB | peak tensor memory {:.0f} MB | "
        "allocator reserved {:.0f} MB\n",
        rates[rates.size() / 2], double(ru.ru_maxrss) / 1024.0,
        double(mem.peak_bytes) / (1024.0 * 1024.0), double(mem.reserved_bytes) / (1024.0 * 1024.0));
  }
  if (pg) {
    ddp.reset();
    rg::dist::destroy_process_group();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  rg::kernels::cpu::ensure_runtime_env(argc, argv);
  CLI::App app{"ringgrad-bench: end-to-end benchmarks"};
  app.require_subcommand(1);
  TrainBenchOptions t;
  CLI::App* train = app.add_subcommand("train", "training throughput on synthetic data");
  train->option_defaults()->always_capture_default();
  train->add_option("--model", t.model, "toynet | mlp | resnet18");
  train->add_option("--batch-size", t.batch_size)->check(CLI::PositiveNumber);
  train->add_option("--amp", t.amp, "off | bf16 | f16 (autocast; f16 with a GradScaler)")
      ->check(CLI::IsMember({"off", "bf16", "f16"}));
  train->add_option("--threads", t.threads, "compute threads (default: all cores)");
  train->add_option("--warmup", t.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  train->add_option("--windows", t.windows, "timed windows (the median is reported)")
      ->check(CLI::PositiveNumber);
  train->add_option("--window-steps", t.window_steps, "steps per window")
      ->check(CLI::PositiveNumber);
  train->add_flag("--ddp", t.ddp,
                  "DistributedDataParallel over Gloo; run under ringgrad-run (reports the job's "
                  "total img/s)");
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
    if (train->parsed()) return run_train_bench(t);
    if (allreduce->parsed()) return rg::apps::run_allreduce_bench(ar);
    if (overlap->parsed()) return rg::apps::run_overlap_bench(ov);
    if (compare->parsed()) return rg::apps::run_compare(cmp);
    if (timeline->parsed()) return rg::apps::run_timeline(tl);
    if (flight->parsed()) return rg::apps::run_flight(flight_files);
    if (scale->parsed()) return rg::apps::scale::run_scale(sc);
    if (profile->parsed()) return rg::apps::run_profile(pf);
  } catch (const rg::InternalError& e) {  // a bug in ringgrad: EX_SOFTWARE
    std::cerr << "ringgrad-bench: " << e.what() << "\n";
    return 70;
  } catch (const rg::Error& e) {
    std::cerr << "ringgrad-bench: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
