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
#include "kernels/cpu/runtime_env.h"
#include "kernels/error.h"

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
