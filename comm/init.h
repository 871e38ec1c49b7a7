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
};

// Connects to the job's store (MASTER_ADDR:MASTER_PORT, RG_STORE_TOKEN; an in-process store
// when world_size is 1), namespaces keys by the restart count, creates the process group and
// makes it the default. Throws rg::Error with what is wrong and what to do.
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options = {});
std::shared_ptr<ProcessGroup> init_process_group(const LaunchEnv& env, const InitOptions& options);

bool is_initialized();
// The default group; throws rg::Error when init_process_group has not been called.
const std::shared_ptr<ProcessGroup>& default_group();
// The job's store (restart-namespaced), for users that need rendezvous of their own.
const std::shared_ptr<Store>& default_store();
void destroy_process_group();

// Creates a process group of `backend` over `store` (used by init_process_group and tests).
std::shared_ptr<ProcessGroup> make_process_group(const std::string& backend,
                                                 std::shared_ptr<Store> store, int rank, int size,
                                                 ProcessGroupOptions options = {});

}  // namespace rg::dist
