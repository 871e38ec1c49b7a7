// PNG line plots for the benchmarks, drawn by gnuplot (Debian's gnuplot-nox, installed by
// scripts/setup-deps.sh): plotting is a solved problem we do not re-solve.
#pragma once

#include <string>
#include <vector>

namespace rg::apps {

struct Series {
  std::string name;
  std::vector<double> x, y;
};

struct PlotSpec {
  std::string title, xlabel, ylabel;
  bool logx = false, logy = false;
  bool x_is_bytes = false;  // tick labels like 4K, 16M
};

// Writes `path` (PNG); throws rg::Error saying how to install gnuplot when it is missing.
void plot_png(const std::string& path, const PlotSpec& spec, const std::vector<Series>& series);

// A timeline (Gantt) picture: one row per lane, one colored bar per span.
struct TimelineBar {
  double start_ms, end_ms;
  std::string kind;  // picks the color; listed in the legend
};
struct TimelineRow {
  std::string label;
  std::vector<TimelineBar> bars;
};
void plot_timeline_png(const std::string& path, const std::string& title,
                       const std::vector<TimelineRow>& rows);

}  // namespace rg::apps
