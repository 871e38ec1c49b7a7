// Fuzz harness: what ringgrad-bench scale reads (a step profile or a trace, told apart by content:
// profile_from_text), then its re-bucketing and overlap prediction on the profile's numbers.
#include "apps/scale_sim.h"
#include "fuzz/harness.h"

namespace scale = rg::apps::scale;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(rg::fuzz::as_text(data, size));
  rg::fuzz::expect_clean(size, [&] {
    const scale::StepProfile p = scale::profile_from_text(text, "fuzz.json", -1, 0);
    scale::step_profile_json(p);
    p.total_bytes();
    const scale::Cluster cluster = scale::preset("dgx-a100");
    for (const double cap_mb : {0.0, 25.0}) {
      const std::vector<scale::Bucket> buckets = scale::rebucket(p, cap_mb, 1.0);
      std::vector<double> comm_us;
      for (const scale::Bucket& b : buckets)
        comm_us.push_back(scale::allreduce_us(double(b.bytes), 16, cluster, scale::Algo::ring));
      scale::simulate_overlap(p.forward_ms, p.backward_ms, p.optimizer_ms, buckets, comm_us);
    }
  });
  return 0;
}
