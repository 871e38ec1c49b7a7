// ringgrad-bench timeline: the window from rank 0's step-th "forward" to its next one, all ranks.
#include "apps/timeline_plot.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "apps/common/plot.h"
#include "kernels/error.h"

namespace rg::apps {

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

int run_timeline(const TimelineOptions& o) {
  std::ifstream f(o.trace);
  RG_CHECK(f.good(), "cannot read ", o.trace);
  const auto j = nlohmann::json::parse(f, nullptr, false);
  RG_CHECK(j.is_object() && j.contains("traceEvents"), o.trace, " is not a Chrome trace");
  // The window: rank 0's step-th forward to its next forward.
  std::vector<double> forwards;
  int ranks = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("ph", "") == "M") continue;
    ranks = std::max(ranks, e.value("pid", 0) + 1);
    if (e.value("pid", 0) == 0 && e.value("name", "") == "forward")
      forwards.push_back(e.value("ts", 0.0));
  }
  std::sort(forwards.begin(), forwards.end());
  RG_CHECK(size_t(o.step) + 1 < forwards.size(), o.trace, " has ", forwards.size(),
           " traced steps; --step must be below ", forwards.size() - 1);
  const double t0 = forwards[size_t(o.step)], t1 = forwards[size_t(o.step) + 1];
  std::vector<TimelineRow> rows;
  for (int r = 0; r < ranks; ++r)
    for (const char* lane : {"step", "DDP", "all-reduce"})
      rows.push_back({fmt::format("rank {} {}", r, lane), {}});
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e.value("ph", ""), cat = e.value("cat", ""), name = e.value("name", "");
    if (ph == "M") continue;
    const double ts = e.value("ts", 0.0), dur = e.value("dur", 0.0);
    if (ts + dur < t0 || ts > t1) continue;
    const size_t base = size_t(e.value("pid", 0)) * 3;
    const double a = (std::max(ts, t0) - t0) / 1000, b = (std::min(ts + dur, t1) - t0) / 1000;
    if (cat == "step" || cat == "data") {
      rows[base].bars.push_back({a, b, name});
    } else if (cat == "comm") {
      rows[base + 2].bars.push_back({a, b, "all-reduce of a bucket"});
    } else if (cat == "ddp" && ph == "X") {
      rows[base + 1].bars.push_back({a, b, "DDP waits for the buckets"});
    } else if (cat == "ddp" && name.rfind("bucket", 0) == 0) {
      rows[base + 1].bars.push_back({a, a + (t1 - t0) / 1000 / 300, "bucket ready"});
    }
  }
  plot_timeline_png(o.out, o.title.empty() ? fmt::format("{}: step {}", o.trace, o.step) : o.title,
                    rows);
  fmt::print("wrote {} ({:.1f} ms window)\n", o.out, (t1 - t0) / 1000);
  return 0;
}

}  // namespace rg::apps
