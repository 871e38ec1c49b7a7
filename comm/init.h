// init_process_group: joins the job described by the launch environment (comm/env.h) and makes
// its process group the default one, as torch.distributed.init_process_group does.
#pragma once

#include <memory>
#include <string>

#include "comm/env.h"
#include "comm/process_group.h"
#include "comm/store.h"

namespace rg::dist {

struct InitOptions {
  std::string backend = "auto";  // "gloo", "nccl" or "auto" (nccl when a GPU is used, else gloo)
  ProcessGroupOptions group;
  // Where the ranks meet, as torch.distributed.init_process_group's init_method:
  //   "env://"           MASTER_ADDR:MASTER_PORT from the launch environment (comm/env.h);
  //   "tcp://HOST:PORT"  that address instead;
  //   "file:///PATH"     a FileStore (comm/file_store.h) in a file every rank can lock.
  // With env:// and tcp://, rank 0 hosts the TCP store unless the launcher does
  // (LaunchEnv::launcher_store, set by ringgrad-run).
  std::string init_method = "env://";
  int rank = -1;        // >= 0: this process's rank instead of the environment's
  int world_size = -1;  // >= 1: the job's size instead of the environment's
};

// Meets the other ranks through the store init_method names (an in-process store for a single
// process without launch variables), namespaces keys by the restart count, creates the process
// group and makes it the default. Throws rg::Error with what is wrong and what to do.
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options = {});
std::shared_ptr<ProcessGroup> init_process_group(const LaunchEnv& env, const InitOptions& options);

bool is_initialized();
// The default group; throws rg::Error when init_process_group has not been called.
const std::shared_ptr<ProcessGroup>& default_group();
// The job's store (restart-namespaced), for users that need rendezvous of their own.
const std::shared_ptr<Store>& default_store();
// Leaves the job. The rank that hosts the TCP store (rank 0 without a launcher store) first waits
// (up to the group timeout) until every other rank has called destroy_process_group, so no rank
// loses the store while it still needs it. A FileStore's file goes with the last rank's store.
void destroy_process_group();

// Creates a process group of `backend` over `store` (used by init_process_group and tests),
// inside the recording and checking layer of comm/debug_group.h.
std::shared_ptr<ProcessGroup> make_process_group(const std::string& backend,
                                                 std::shared_ptr<Store> store, int rank, int size,
                                                 ProcessGroupOptions options = {});

}  // namespace rg::dist
