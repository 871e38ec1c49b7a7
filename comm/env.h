// The launch contract: which rank this process is and where the job's store lives, read from
// the torchrun variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) or their Slurm and Open MPI equivalents.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace rg::dist {

struct LaunchEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t port = 29500;     // MASTER_PORT
  std::string token;         // RG_STORE_TOKEN (empty when the launcher set none)
  int restart_count = 0;     // RG_RESTART_COUNT (ringgrad-run's restart generation)
  std::string source;        // "torchrun", "slurm", "openmpi" or "default" (single process)
  // RG_LAUNCHER_STORE=1: the launcher (ringgrad-run) hosts the store at MASTER_ADDR:MASTER_PORT.
  // Otherwise rank 0 hosts it there, as PyTorch's env:// does, so srun, mpirun, a shell loop or
  // dist::spawn need nothing else.
  bool launcher_store = false;
};

// Reads the launch variables through `getenv` (defaults to std::getenv; tests pass a map).
// Without any rank variable it describes a single process (world size 1). Throws rg::Error
// naming the variable for a missing, malformed or inconsistent value (e.g. RANK >= WORLD_SIZE,
// RANK set without WORLD_SIZE).
LaunchEnv read_launch_env(
    const std::function<std::optional<std::string>(const std::string&)>& getenv = {});

}  // namespace rg::dist
