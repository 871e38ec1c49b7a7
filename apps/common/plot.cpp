// plot_png: writes the data inline into a gnuplot script and runs gnuplot on it.
#include "apps/common/plot.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kernels/error.h"

namespace rg::apps {
namespace {

std::string quote(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return q + "\"";
}

// Writes the script to a temporary file and runs gnuplot on it.
void run_gnuplot(const std::string& path, const std::string& script_text) {
  RG_CHECK(std::system("command -v gnuplot >/dev/null 2>&1") == 0, "cannot write ", path,
           ": gnuplot is not installed (apt-get install gnuplot-nox, or "
           "run scripts/setup-deps.sh)");
  char script[] = "/tmp/ringgrad-plot-XXXXXX";
  const int fd = mkstemp(script);
  RG_CHECK(fd >= 0, "cannot create a temporary file for gnuplot");
  close(fd);
  {
    std::ofstream f(script);
    f << script_text;
  }
  const std::string cmd = std::string("gnuplot ") + script + " 2>&1";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    const int rc = pclose(p);
    std::remove(script);
    RG_CHECK(rc == 0, "gnuplot failed writing ", path, ": ", out);
  } else {
    std::remove(script);
    RG_FAIL("cannot run gnuplot");
  }
}

}  // namespace

void plot_png(const std::string& path, const PlotSpec& spec, const std::vector<Series>& series) {
  RG_CHECK(std::system("command -v gnuplot >/dev/null 2>&1") == 0, "cannot write ", path,
           ": gnuplot is not installed (apt-get install gnuplot-nox, or "
           "run scripts/setup-deps.sh)");
  std::ostringstream g;
  g << "set terminal pngcairo size 1000,600 font \",11\"\n"
    << "set output " << quote(path) << "\n"
    << "set title " << quote(spec.title) << "\n"
    << "set xlabel " << quote(spec.xlabel) << "\nset ylabel " << quote(spec.ylabel) << "\n"
    << "set grid\nset key left top\n";
  if (spec.logx) g << "set logscale x 2\n";
  if (spec.logy) g << "set logscale y\n";
  if (spec.x_is_bytes) g << "set format x '%.0b%B'\n";  // binary prefixes: 4, 1K, 64M
  for (size_t i = 0; i < series.size(); ++i)
    g << "$d" << i << " << EOD\n"
      <<
        [&] {
          std::ostringstream d;
          for (size_t k = 0; k < series[i].x.size(); ++k)
            d << series[i].x[k] << " " << series[i].y[k] << "\n";
          return d.str();
        }()
      << "EOD\n";
  g << "plot ";
  for (size_t i = 0; i < series.size(); ++i)
    g << (i ? ", " : "") << "$d" << i << " using 1:2 with linespoints lw 2 title "
      << quote(series[i].name);
  g << "\n";
  run_gnuplot(path, g.str());
}

void plot_timeline_png(const std::string& path, const std::string& title,
                       const std::vector<TimelineRow>& rows) {
  static const char* kColors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759",
                                  "#b07aa1", "#9c755f", "#76b7b2", "#edc948"};
  std::vector<std::string> kinds;
  for (const auto& r : rows)
    for (const auto& b : r.bars)
      if (std::find(kinds.begin(), kinds.end(), b.kind) == kinds.end()) kinds.push_back(b.kind);
  std::ostringstream g;
  g << "set terminal pngcairo size 1400," << 120 + 45 * rows.size() << " font \",10\"\n"
    << "set output " << quote(path) << "\nset title " << quote(title) << "\n"
    << "set xlabel \"time (ms)\"\nset grid x\nset key outside bottom center horizontal\n"
    << "set yrange [-0.7:" << double(rows.size()) - 0.3 << "]\nset style fill solid 0.9\n"
    << "set ytics (";
  for (size_t i = 0; i < rows.size(); ++i)
    g << (i ? ", " : "") << quote(rows[i].label) << " " << rows.size() - 1 - i;
  g << ")\n";
  for (size_t k = 0; k < kinds.size(); ++k) {
    g << "$k" << k << " << EOD\n";
    for (size_t i = 0; i < rows.size(); ++i)
      for (const auto& b : rows[i].bars)
        if (b.kind == kinds[k]) {
          const double y = double(rows.size() - 1 - i);
          g << (b.start_ms + b.end_ms) / 2 << " " << y << " " << b.start_ms << " " << b.end_ms
            << " " << y - 0.35 << " " << y + 0.35 << "\n";
        }
    g << "EOD\n";
  }
  g << "plot ";
  for (size_t k = 0; k < kinds.size(); ++k)
    g << (k ? ", " : "") << "$k" << k << " using 1:2:3:4:5:6 with boxxyerror lc rgb \""
      << kColors[k % 8] << "\" title " << quote(kinds[k]);
  g << "\n";
  run_gnuplot(path, g.str());
}

}  // namespace rg::apps
