// Fuzz harness: a Chrome trace (ringgrad-train --trace) through parse_trace, the reader of
// ringgrad-bench profile, timeline and scale, then what profile computes from it and the step
// profile that scale extracts from it.
#include "apps/profile_table.h"
#include "apps/scale_sim.h"
#include "apps/trace_file.h"
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(rg::fuzz::as_text(data, size));
  rg::fuzz::expect_clean(size, [&] {
    const rg::apps::Trace trace = rg::apps::parse_trace(text, "fuzz.json");
    for (int pid = 0; pid < std::min(trace.processes, 2); ++pid) trace.step_starts(pid);
    rg::fuzz::expect_clean(size, [&] {
      const rg::apps::Profile p = rg::apps::compute_profile(trace, 0, "");
      rg::apps::profile_table(p);
      rg::apps::profile_csv(p);
    });
  });
  for (const int step : {-1, 0})
    rg::fuzz::expect_clean(
        size, [&] { rg::apps::scale::profile_from_trace(text, "fuzz.json", step, 0); });
  return 0;
}
