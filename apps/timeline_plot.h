// ringgrad-bench timeline: draws one training step of a --trace file (ringgrad-train) as a PNG:
// per rank, the step's phases, DDP's bucket events and the all-reduces on their own row.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace rg::apps {

struct TimelineOptions {
  std::string trace, out = "timeline.png";
  int step = 3;  // which traced step (0-based; later steps run with the rebuilt buckets)
  std::string title;
};

CLI::App* add_timeline_command(CLI::App& app, TimelineOptions& o);
int run_timeline(const TimelineOptions& o);

}  // namespace rg::apps
