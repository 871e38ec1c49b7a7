// ringgrad-bench timeline: the window from rank 0's step-th "forward" to its next one, all ranks.
#include "apps/timeline_plot.h"

#include <fmt/format.h>

#include <algorithm>

#include "apps/common/plot.h"
#include "apps/trace_file.h"
#include "kernels/error.h"

namespace rg::apps {

int run_timeline(const TimelineOptions& o) {
  const Trace trace = read_trace(o.trace);
  // The window: rank 0's step-th forward to its next forward.
  const std::vector<double> forwards = trace.step_starts(0);
  RG_CHECK(size_t(o.step) + 1 < forwards.size(), o.trace, " has ", forwards.size(),
           " traced steps; --step must be below ", forwards.size() - 1);
  const double t0 = forwards[size_t(o.step)], t1 = forwards[size_t(o.step) + 1];
  std::vector<TimelineRow> rows;
  for (int r = 0; r < trace.processes; ++r)
    for (const char* lane : {"step", "DDP", "all-reduce"})
      rows.push_back({fmt::format("rank {} {}", r, lane), {}});
  for (const TraceEvent& e : trace.events) {
    const std::string &cat = e.cat, &name = e.name;
    const double ts = e.ts, dur = e.dur;
    if (ts + dur < t0 || ts > t1) continue;
    const size_t base = size_t(e.pid) * 3;
    const double a = (std::max(ts, t0) - t0) / 1000, b = (std::min(ts + dur, t1) - t0) / 1000;
    if (cat == "step" || cat == "data") {
      rows[base].bars.push_back({a, b, name});
    } else if (cat == "comm") {
      rows[base + 2].bars.push_back({a, b, "all-reduce of a bucket"});
    } else if (cat == "ddp" && e.ph == 'X') {
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
