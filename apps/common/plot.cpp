// plot_png: writes the data inline into a gnuplot script and runs gnuplot on it.
#include "apps/common/plot.h"

#include <unistd.h>

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
  char script[] = "/tmp/ringgrad-plot-XXXXXX";
  const int fd = mkstemp(script);
  RG_CHECK(fd >= 0, "cannot create a temporary file for gnuplot");
  close(fd);
  {
    std::ofstream f(script);
    f << g.str();
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

}  // namespace rg::apps
