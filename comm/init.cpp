// The default process group and how it is created from the launch environment.
#include "comm/init.h"

#include <unistd.h>

#include <mutex>

#include "comm/hash_store.h"
#include "comm/prefix_store.h"
#include "comm/process_group_gloo.h"
#include "comm/process_group_nccl.h"
#include "comm/sync_batch_norm.h"
#include "comm/tcp_store.h"
#include "kernels/error.h"
#include "layers/sync_batch_norm.h"

namespace rg::dist {
namespace {

struct DefaultGroup {
  std::mutex mu;
  std::shared_ptr<ProcessGroup> group;
  std::shared_ptr<Store> store;
};

DefaultGroup& state() {
  static DefaultGroup s;
  return s;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

}  // namespace

std::shared_ptr<ProcessGroup> make_process_group(const std::string& backend,
                                                 std::shared_ptr<Store> store, int rank, int size,
                                                 ProcessGroupOptions options) {
  // "auto" is gloo: the group does not know where the model lives, and NCCL needs CUDA tensors
  // (ringgrad-train picks nccl itself for --device cuda).
  if (backend == "gloo" || backend == "auto")
    return std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, std::move(options));
  if (backend == "nccl")
    return std::make_shared<ProcessGroupNCCL>(std::move(store), rank, size, std::move(options));
  RG_FAIL("unknown backend '", backend, "' (expected gloo, nccl or auto)");
}

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  return init_process_group(read_launch_env(), options);
}

std::shared_ptr<ProcessGroup> init_process_group(const LaunchEnv& env, const InitOptions& options) {
  auto& s = state();
  std::lock_guard lock(s.mu);
  RG_CHECK(!s.group, "init_process_group: already initialized (call destroy_process_group first)");
  std::shared_ptr<Store> base;
  if (env.world_size == 1 && env.source == "default") {
    base = std::make_shared<HashStore>();
  } else {
    TcpStoreOptions so;
    so.host = env.master_addr;
    so.port = env.port;
    so.token = env.token;
    so.timeout = options.group.timeout;
    so.connect_timeout = options.group.timeout;
    base = std::make_shared<TcpStore>(so);
  }
  auto store = std::make_shared<PrefixStore>("restart" + std::to_string(env.restart_count), base);
  store->set_timeout(options.group.timeout);
  ProcessGroupOptions group = options.group;
  if (group.hostname.empty()) {
    // Every rank on this node (and a loopback master): loopback is enough and always works.
    const bool single_node = env.local_world_size == env.world_size || is_loopback(env.master_addr);
    if (!single_node) {
      char host[256] = {};
      RG_CHECK(gethostname(host, sizeof(host) - 1) == 0, "gethostname failed");
      group.hostname = host;
    }
  }
  s.group = make_process_group(options.backend, store, env.rank, env.world_size, group);
  s.store = store;
  // SyncBatchNorm layers without a group of their own use this one, as PyTorch's group.WORLD.
  nn::set_default_batch_norm_collectives(
      std::make_shared<ProcessGroupBatchNormCollectives>(s.group));
  return s.group;
}

bool is_initialized() {
  auto& s = state();
  std::lock_guard lock(s.mu);
  return s.group != nullptr;
}

const std::shared_ptr<ProcessGroup>& default_group() {
  auto& s = state();
  std::lock_guard lock(s.mu);
  RG_CHECK(s.group, "no default process group: call rg::dist::init_process_group() first");
  return s.group;
}

const std::shared_ptr<Store>& default_store() {
  auto& s = state();
  std::lock_guard lock(s.mu);
  RG_CHECK(s.store, "no default store: call rg::dist::init_process_group() first");
  return s.store;
}

void destroy_process_group() {
  auto& s = state();
  std::lock_guard lock(s.mu);
  nn::set_default_batch_norm_collectives(nullptr);
  s.group.reset();
  s.store.reset();
}

}  // namespace rg::dist
