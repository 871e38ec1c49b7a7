// single / dp / ddp as ringgrad-train runs, read back from their --metrics files.
#include "apps/compare_bench.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/common/plot.h"
#include "engine/cuda/runtime.h"
#include "kernels/error.h"

namespace rg::apps {
namespace {

namespace fs = std::filesystem;

// One mode's run: what it ran on and what its metrics say.
struct ModeResult {
  std::string mode, where;
  int devices = 1;
  std::vector<int> epochs;
  std::vector<double> top1, seconds, img_per_s;
  double final_top1 = 0, final_top5 = 0;
  std::vector<double> peak_mb;  // per device (per process on the CPU)
};

fs::path sibling(const std::string& name) {
  return fs::read_symlink("/proc/self/exe").parent_path() / name;
}

// Runs argv with `env` added, output to `log`; returns the exit code.
int run_logged(const std::vector<std::string>& argv, const std::vector<std::string>& env,
               const fs::path& log) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  RG_CHECK(pid >= 0, "compare: cannot fork: ", std::strerror(errno));
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string tail_of(const fs::path& p, size_t lines) {
  std::ifstream in(p);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += "  " + all[i] + "\n";
  return out;
}

ModeResult read_metrics(const fs::path& path, ModeResult r) {
  std::ifstream in(path);
  RG_CHECK(in.good(), "compare: the run wrote no metrics file ", path.string());
  bool final_seen = false;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("type") == "epoch") {
      r.epochs.push_back(j.at("epoch").get<int>());
      r.seconds.push_back(j.at("seconds").get<double>());
      r.img_per_s.push_back(j.at("img_per_s").get<double>());
      r.top1.push_back(j.contains("top1") ? j.at("top1").get<double>() : std::nan(""));
    } else if (j.at("type") == "final") {
      final_seen = true;
      r.final_top1 = j.at("top1").get<double>();
      r.final_top5 = j.at("top5").get<double>();
      if (j.contains("peak_device_mb")) {
        for (const auto& v : j.at("peak_device_mb")) r.peak_mb.push_back(v.get<double>());
      } else {
        r.peak_mb.assign(size_t(r.devices), j.at("peak_rss_mb").get<double>());
      }
    }
  }
  RG_CHECK(final_seen, "compare: ", path.string(), " has no final line (did the run finish?)");
  return r;
}

}  // namespace

int run_compare(const CompareOptions& o) {
  RG_CHECK(o.global_batch % o.devices == 0, "compare: --global-batch ", o.global_batch,
           " must divide evenly over --devices ", o.devices, " (ddp's batch per rank)");
  int gpus = 0;
  try {
    gpus = cuda::runtime().device_count();
  } catch (const Error&) {
    gpus = 0;
  }
  std::string where = o.device;
  if (where == "auto") where = gpus >= o.devices ? "cuda" : "cpu";
  RG_CHECK(where != "cuda" || gpus >= o.devices, "compare: --device cuda needs ", o.devices,
           " GPUs; this process sees ", gpus);
  const fs::path work = o.work_dir.empty() ? fs::temp_directory_path() /
                                                 fmt::format("ringgrad-compare-{}", ::getpid())
                                           : fs::path(o.work_dir);
  fs::create_directories(work);
  const fs::path train = sibling("ringgrad-train"), train_emu = sibling("ringgrad-train-emu"),
                 launcher = sibling("ringgrad-run");
  fmt::print("# compare: {} on {}, global batch {}, {} epoch(s), {} {} lr {}; runs in {}\n",
             o.model, o.dataset, o.global_batch, o.epochs, o.optimizer, o.lr_schedule, o.lr,
             work.string());
  std::vector<ModeResult> results;
  for (const std::string& mode : o.modes) {
    ModeResult r;
    r.mode = mode;
    r.devices = mode == "single" ? 1 : o.devices;
    // The device kind this mode runs on, and the binary that has it.
    const bool emulated = where == "emulated" || (where == "cpu" && mode == "dp");
    const bool on_cuda = emulated || where == "cuda";
    r.where = emulated ? "emulated devices" : on_cuda ? "GPUs" : "CPU";
    const fs::path binary = emulated ? train_emu : train;
    RG_CHECK(fs::exists(binary), "compare: ", binary.string(),
             " is missing (build it: cmake --build <build> --target ", binary.filename().string(),
             ")");
    const fs::path metrics = work / (mode + ".jsonl"), log = work / (mode + ".log");
    std::vector<std::string> argv;
    if (mode == "ddp")
      argv = {launcher.string(), "--nproc-per-node", std::to_string(o.devices), "--master-port",
              "0"};
    argv.insert(argv.end(),
                {binary.string(),
                 "--model",
                 o.model,
                 "--dataset",
                 o.dataset,
                 "--epochs",
                 std::to_string(o.epochs),
                 "--batch-size",
                 std::to_string(mode == "ddp" ? o.global_batch / o.devices : o.global_batch),
                 "--optimizer",
                 o.optimizer,
                 "--lr",
                 fmt::format("{}", o.lr),
                 "--lr-schedule",
                 o.lr_schedule,
                 "--seed",
                 std::to_string(o.seed),
                 "--workers",
                 std::to_string(o.workers),
                 "--eval-every",
                 "1",
                 "--metrics",
                 metrics.string(),
                 "--mode",
                 mode,
                 "--device",
                 on_cuda ? "cuda" : "cpu"});
    if (!o.data_dir.empty()) argv.insert(argv.end(), {"--data-dir", o.data_dir});
    if (o.max_steps >= 0) argv.insert(argv.end(), {"--max-steps", std::to_string(o.max_steps)});
    if (mode == "dp") argv.insert(argv.end(), {"--dp-devices", std::to_string(o.devices)});
    if (mode == "ddp" && on_cuda) argv.insert(argv.end(), {"--backend", "nccl"});
    std::vector<std::string> env;
    // Emulated devices: every process sees the machine's o.devices; dp uses all of them in its
    // one process, each ddp rank its own (rank % devices: NCCL refuses two ranks on one GPU).
    if (emulated) env.push_back(fmt::format("RG_EMU_DEVICES={}", o.devices));
    fmt::print("# {}: {} device(s) on the {}...\n", mode, r.devices, r.where);
    std::fflush(stdout);
    const int code = run_logged(argv, env, log);
    RG_CHECK(code == 0, "compare: the ", mode, " run failed (exit code ", code, "); its log ",
             log.string(), " ends with:\n", tail_of(log, 15));
    results.push_back(read_metrics(metrics, r));
  }
  double target = o.target_top1;
  if (target <= 0) {
    target = 1;
    for (const ModeResult& r : results) target = std::min(target, r.final_top1);
  }
  const auto time_to = [&](const ModeResult& r) -> std::string {
    double t = 0;
    for (size_t i = 0; i < r.epochs.size(); ++i) {
      t += r.seconds[i];
      if (!std::isnan(r.top1[i]) && r.top1[i] >= target) return fmt::format("{:.1f} s", t);
    }
    return "not reached";
  };
  const auto peak = [](const ModeResult& r) {
    std::string s;
    for (size_t i = 0; i < r.peak_mb.size(); ++i)
      s += fmt::format("{}{:.0f}", i ? " / " : "", r.peak_mb[i]);
    return s + " MiB";
  };
  const auto rate = [](const ModeResult& r) {
    std::vector<double> v = r.img_per_s;
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  fmt::print("\n{:<7} {:<17} {:>7} {:>12} {:>7} {:>7} {:>9}  {:<24} {}\n", "mode", "where",
             "devices", "global batch", "top-1", "top-5", "img/s", "peak memory per device",
             fmt::format("time to {:.2f}% top-1", 100 * target));
  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv);
    RG_CHECK(csv.good(), "compare: cannot write ", o.csv);
    csv << "mode,where,devices,global_batch,top1,top5,img_per_s,peak_mb,time_to_target\n";
  }
  for (const ModeResult& r : results) {
    fmt::print("{:<7} {:<17} {:>7} {:>12} {:>6.2f}% {:>6.2f}% {:>9.1f}  {:<24} {}\n", r.mode,
               r.where, r.devices, o.global_batch, 100 * r.final_top1, 100 * r.final_top5, rate(r),
               peak(r), time_to(r));
    if (csv.is_open())
      csv << fmt::format("{},{},{},{},{},{},{},{},{}\n", r.mode, r.where, r.devices, o.global_batch,
                         r.final_top1, r.final_top5, rate(r), peak(r), time_to(r));
  }
  if (!o.plot.empty()) {
    std::vector<Series> series;
    for (const ModeResult& r : results) {
      Series s{r.mode + " (" + r.where + ")", {}, {}};
      for (size_t i = 0; i < r.epochs.size(); ++i) {
        if (std::isnan(r.top1[i])) continue;
        s.x.push_back(r.epochs[i]);
        s.y.push_back(100 * r.top1[i]);
      }
      series.push_back(s);
    }
    plot_png(o.plot,
             {.title = fmt::format("{} on {}: top-1 per epoch, global batch {}", o.model, o.dataset,
                                   o.global_batch),
              .xlabel = "epoch",
              .ylabel = "top-1 (%)"},
             series);
    fmt::print("# wrote {}\n", o.plot);
  }
  return 0;
}

}  // namespace rg::apps
