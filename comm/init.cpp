// The default process group and how it is created from the launch environment.
#include "comm/init.h"

#include <unistd.h>

#include <charconv>
#include <filesystem>
#include <mutex>

#include "comm/debug_group.h"
#include "comm/file_store.h"
#include "comm/flight_recorder.h"
#include "comm/hash_store.h"
#include "comm/heartbeat.h"
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
  // Rank 0's TCP store server when no launcher hosts one.
  std::unique_ptr<TcpStoreServer> server;
  bool rank0_hosts = false;  // every rank knows whether rank 0 hosts the store
  int rank = 0, world_size = 1;
};

DefaultGroup& state() {
  static DefaultGroup s;
  return s;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// init_method, parsed.
struct InitMethod {
  enum Kind { env, tcp, file } kind = env;
  std::string host;
  uint16_t port = 0;
  std::string path;
};

InitMethod parse_init_method(const std::string& m) {
  InitMethod out;
  const std::string help = " (expected env://, tcp://HOST:PORT or file:///PATH)";
  if (m.empty() || m == "env://") return out;
  if (m.rfind("tcp://", 0) == 0) {
    out.kind = InitMethod::tcp;
    std::string rest = m.substr(6);
    const size_t colon = rest.rfind(':');
    RG_CHECK(colon != std::string::npos && colon > 0, "init_method '", m, "' has no HOST:PORT",
             help);
    out.host = rest.substr(0, colon);
    if (out.host.size() > 2 && out.host.front() == '[' && out.host.back() == ']')
      out.host = out.host.substr(1, out.host.size() - 2);  // [::1]
    const std::string port = rest.substr(colon + 1);
    int p = 0;
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    RG_CHECK(ec == std::errc() && ptr == port.data() + port.size() && p >= 1 && p <= 65535,
             "init_method '", m, "': '", port, "' is not a port (1-65535)");
    out.port = uint16_t(p);
    return out;
  }
  if (m.rfind("file://", 0) == 0) {
    out.kind = InitMethod::file;
    out.path = m.substr(7);
    RG_CHECK(!out.path.empty() && out.path.front() == '/', "init_method '", m,
             "' must name an absolute path (file:///tmp/rendezvous)");
    return out;
  }
  RG_FAIL("unknown init_method '", m, "'", help);
}

// The address rank 0's store listens on: loopback when the job's address is loopback (one
// host), otherwise every interface, as PyTorch's TCPStore.
std::string bind_address(const std::string& master) {
  return is_loopback(master) ? "127.0.0.1" : "0.0.0.0";
}

}  // namespace

std::shared_ptr<ProcessGroup> make_process_group(const std::string& backend,
                                                 std::shared_ptr<Store> store, int rank, int size,
                                                 ProcessGroupOptions options) {
  // "auto" is gloo: the group does not know where the model lives, and NCCL needs CUDA tensors
  // (ringgrad-train picks nccl itself for --device cuda).
  std::shared_ptr<ProcessGroup> group;
  if (backend == "gloo" || backend == "auto")
    group = std::make_shared<ProcessGroupGloo>(store, rank, size, std::move(options));
  else if (backend == "nccl")
    group = std::make_shared<ProcessGroupNCCL>(store, rank, size, std::move(options));
  else
    RG_FAIL("unknown backend '", backend, "' (expected gloo, nccl or auto)");
  // Every group is recorded (the flight recorder) and, under DETAIL, checked across ranks.
  return std::make_shared<DebugProcessGroup>(std::move(group), std::move(store));
}

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  return init_process_group(read_launch_env(), options);
}

std::shared_ptr<ProcessGroup> init_process_group(const LaunchEnv& launch,
                                                 const InitOptions& options) {
  auto& s = state();
  std::lock_guard lock(s.mu);
  RG_CHECK(!s.group, "init_process_group: already initialized (call destroy_process_group first)");
  LaunchEnv env = launch;
  if (options.world_size >= 1) env.world_size = options.world_size;
  if (options.rank >= 0) env.rank = options.rank;
  RG_CHECK(options.world_size == -1 || options.world_size >= 1,
           "init_process_group: world_size must be at least 1, got ", options.world_size);
  RG_CHECK(env.rank < env.world_size, "init_process_group: rank ", env.rank,
           " must be less than the world size ", env.world_size);
  // SIGUSR1 dumps the flight recorder; installed before the first heartbeat, because ringgrad-run
  // asks only workers that have sent one (SIGUSR1 would end a process without the handler).
  FlightRecorder::install_signal_dump(env.rank, env.world_size);
  start_heartbeat_from_env();  // ringgrad-run watches for a stopped or hung worker
  const bool explicit_job = options.rank >= 0 || options.world_size >= 1;
  if (explicit_job && options.world_size >= 1 && launch.source == "default") {
    env.local_world_size = env.world_size;  // ranks given by hand: one host unless told
    env.local_rank = env.rank;
  }
  const InitMethod method = parse_init_method(options.init_method);
  std::shared_ptr<Store> base;
  s.server.reset();
  s.rank0_hosts = false;
  if (method.kind == InitMethod::file) {
    base = std::make_shared<FileStore>(method.path, env.world_size);
  } else if (env.world_size == 1 && env.source == "default" && method.kind == InitMethod::env) {
    base = std::make_shared<HashStore>();
  } else {
    if (method.kind == InitMethod::tcp) {
      env.master_addr = method.host;
      env.port = method.port;
    }
    s.rank0_hosts = !env.launcher_store || method.kind == InitMethod::tcp;
    if (env.rank == 0 && s.rank0_hosts) {
      TcpStoreServerOptions so;
      so.host = bind_address(env.master_addr);
      so.port = env.port;
      so.token = env.token;
      try {
        s.server = std::make_unique<TcpStoreServer>(so);
      } catch (const Error& e) {
        RG_FAIL("rank 0 hosts the job's store (no launcher does) but cannot: ", e.what(),
                ". Is another job using port ", env.port,
                "? Choose a free MASTER_PORT (or init_method tcp://HOST:PORT)");
      }
    }
    TcpStoreOptions so;
    so.host = env.master_addr;
    so.port = env.port;
    so.token = env.token;
    so.timeout = options.group.timeout;
    so.connect_timeout = options.group.timeout;
    base = std::make_shared<TcpStore>(so);
  }
  s.rank = env.rank;
  s.world_size = env.world_size;
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
  if (s.store && s.server && s.world_size > 1) {
    // Everyone says goodbye; the host of the store waits for all before it goes away.
    try {
      s.store->wait({"rg.all_destroyed"});
    } catch (const Error&) {
      // A rank that never arrives (it failed) must not keep this one from exiting.
    }
  } else if (s.store && s.rank0_hosts && s.world_size > 1) {
    try {
      if (s.store->add("rg.destroyed", 1) == s.world_size - 1)
        s.store->set("rg.all_destroyed", "1");
    } catch (const Error&) {
      // The host is gone already: nothing left to tell.
    }
  }
  nn::set_default_batch_norm_collectives(nullptr);
  s.group.reset();
  s.store.reset();
  s.server.reset();
}

}  // namespace rg::dist
