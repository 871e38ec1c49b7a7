// ringgrad-bench allreduce: all-reduce time and bandwidth over a size sweep, in the nccl-tests
// style, for each backend/algorithm pair. Run it under ringgrad-run (one process per rank).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace rg::apps {

struct AllreduceBenchOptions {
  std::vector<std::string> algorithms = {"gloo-native", "gloo-ring", "gloo-shm", "nccl-native",
                                         "nccl-ring"};
  std::string min_bytes = "4", max_bytes = "256M";
  int step_factor = 2;
  std::string dtype = "f32";
  int iters = 0;  // 0: automatic (more for small sizes)
  int warmup = 3;
  std::string csv, plot;
  int64_t chunk_kib = 1024;      // the ring's pipelining chunk
  int64_t shm_chunk_kib = 1024;  // the shared-memory collectives' chunk
};

CLI::App* add_allreduce_command(CLI::App& app, AllreduceBenchOptions& o);
int run_allreduce_bench(const AllreduceBenchOptions& o);

// "4", "64K", "16M", "1G" -> bytes; rg::Error otherwise.
uint64_t parse_bytes(const std::string& s);

}  // namespace rg::apps
