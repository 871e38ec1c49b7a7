// The launch contract: reads this process's rank and the job's store address from the torchrun,
// Slurm or Open MPI variables (in that order of precedence), checking every value.
#include "comm/env.h"

#include <charconv>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "kernels/error.h"

namespace rg::dist {
namespace {

using Getenv = std::function<std::optional<std::string>(const std::string&)>;

constexpr int kDefaultPort = 29500;

// An empty value counts as unset: `export RANK=` and job scripts that blank a variable mean
// "not given", and treating it as a malformed integer would only confuse.
std::optional<std::string> lookup(const Getenv& getenv, const std::string& name) {
  std::optional<std::string> value = getenv(name);
  if (value && value->empty()) return std::nullopt;
  return value;
}

// The whole value must be a decimal int (no sign other than a leading '-', no spaces), so that a
// typo such as RANK=1x is reported instead of being read as 1.
int parse_int(const std::string& name, const std::string& value) {
  int out = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, out);
  RG_CHECK(ec == std::errc() && ptr == end, name, "='", value, "' is not an integer");
  return out;
}

int parse_at_least(const std::string& name, const std::string& value, int min) {
  const int v = parse_int(name, value);
  RG_CHECK(v >= min, name, "=", value, " must be ", min == 0 ? "non-negative" : "at least 1");
  return v;
}

std::optional<int> read_int(const Getenv& getenv, const std::string& name, int min) {
  std::optional<std::string> value = lookup(getenv, name);
  if (!value) return std::nullopt;
  return parse_at_least(name, *value, min);
}

// Slurm's per-node task counts ("4(x2),3" = 4, 4, 3), expanded to one entry per node.
std::vector<int> parse_slurm_tasks_per_node(const std::string& name, const std::string& value) {
  std::vector<int> counts;
  std::string_view rest = value;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    int count = 0;
    int repeat = 1;
    const size_t paren = item.find('(');
    bool ok = !item.empty();
    if (ok) {
      const std::string_view count_text = item.substr(0, paren);
      auto [p, ec] =
          std::from_chars(count_text.data(), count_text.data() + count_text.size(), count);
      ok = ec == std::errc() && p == count_text.data() + count_text.size() && count >= 1;
    }
    if (ok && paren != std::string_view::npos) {
      // "(xN)": the repetition count.
      const std::string_view rep = item.substr(paren);
      ok = rep.size() > 3 && rep.substr(0, 2) == "(x" && rep.back() == ')';
      if (ok) {
        const std::string_view digits = rep.substr(2, rep.size() - 3);
        auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), repeat);
        ok = ec == std::errc() && p == digits.data() + digits.size() && repeat >= 1;
      }
    }
    RG_CHECK(ok, name, "='", value, "' is not a Slurm task list such as '4(x2),3'");
    counts.insert(counts.end(), repeat, count);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return counts;
}

struct RankVars {
  int rank = 0;
  int world_size = 1;
  std::optional<int> local_rank;
  std::optional<int> local_world_size;
  // Names for error messages.
  std::string rank_name, world_name, local_rank_name, local_world_name;
};

// Reads one source's required pair (rank, world size); both or neither must be set.
RankVars read_rank_pair(const Getenv& getenv, const std::string& rank_name,
                        const std::string& world_name) {
  const std::optional<std::string> rank = lookup(getenv, rank_name);
  const std::optional<std::string> world = lookup(getenv, world_name);
  RG_CHECK(rank || !world, world_name, "=", *world, " is set but ", rank_name,
           " is not; set both or neither");
  RG_CHECK(world || !rank, rank_name, "=", *rank, " is set but ", world_name,
           " is not; set both or neither");
  RankVars v;
  v.rank_name = rank_name;
  v.world_name = world_name;
  v.rank = parse_at_least(rank_name, *rank, 0);
  v.world_size = parse_at_least(world_name, *world, 1);
  return v;
}

// The checks shared by every source. Without local variables all ranks are taken to run on this
// node (the usual single-machine launch), so a local rank defaults to the global one.
void finish_ranks(RankVars& v, LaunchEnv& env) {
  RG_CHECK(v.rank < v.world_size, v.rank_name, "=", v.rank, " must be less than ", v.world_name,
           "=", v.world_size);
  env.rank = v.rank;
  env.world_size = v.world_size;
  if (!v.local_rank && !v.local_world_size) {
    env.local_rank = v.rank;
    env.local_world_size = v.world_size;
    return;
  }
  RG_CHECK(v.local_rank, v.local_world_name, "=", *v.local_world_size, " is set but ",
           v.local_rank_name, " is not; set both or neither");
  env.local_rank = *v.local_rank;
  env.local_world_size = v.local_world_size.value_or(v.world_size);
  RG_CHECK(env.local_rank < env.local_world_size, v.local_rank_name, "=", env.local_rank,
           " must be less than ", v.local_world_size ? v.local_world_name : v.world_name, "=",
           env.local_world_size);
  RG_CHECK(env.local_world_size <= env.world_size, v.local_world_name, "=", env.local_world_size,
           " must not exceed ", v.world_name, "=", env.world_size);
}

void read_torchrun(const Getenv& getenv, LaunchEnv& env) {
  RankVars v = read_rank_pair(getenv, "RANK", "WORLD_SIZE");
  v.local_rank_name = "LOCAL_RANK";
  v.local_world_name = "LOCAL_WORLD_SIZE";
  v.local_rank = read_int(getenv, "LOCAL_RANK", 0);
  v.local_world_size = read_int(getenv, "LOCAL_WORLD_SIZE", 1);
  finish_ranks(v, env);
  env.source = "torchrun";
}

void read_slurm(const Getenv& getenv, LaunchEnv& env) {
  // srun always sets SLURM_NTASKS; SLURM_NPROCS is its older spelling.
  const bool old_spelling = !lookup(getenv, "SLURM_NTASKS") && lookup(getenv, "SLURM_NPROCS");
  RankVars v =
      read_rank_pair(getenv, "SLURM_PROCID", old_spelling ? "SLURM_NPROCS" : "SLURM_NTASKS");
  v.local_rank_name = "SLURM_LOCALID";
  v.local_rank = read_int(getenv, "SLURM_LOCALID", 0);
  // This node's task count: the step's or job's per-node list (exact, even when nodes hold
  // different counts) indexed by SLURM_NODEID, else the single --ntasks-per-node request.
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const std::optional<std::string> list = lookup(getenv, name);
    if (!list) continue;
    const std::vector<int> counts = parse_slurm_tasks_per_node(name, *list);
    int node = 0;
    if (counts.size() > 1) {
      const std::optional<int> node_id = read_int(getenv, "SLURM_NODEID", 0);
      RG_CHECK(node_id, name, "='", *list, "' lists several nodes but SLURM_NODEID is not set");
      RG_CHECK(*node_id < static_cast<int>(counts.size()), "SLURM_NODEID=", *node_id,
               " is not a node of ", name, "='", *list, "'");
      node = *node_id;
    }
    v.local_world_size = counts[node];
    v.local_world_name = name;
    break;
  }
  if (!v.local_world_size) {
    v.local_world_size = read_int(getenv, "SLURM_NTASKS_PER_NODE", 1);
    v.local_world_name = "SLURM_NTASKS_PER_NODE";
  }
  if (!v.local_world_size) {
    // Without a per-node count the local size is only known on a one-node allocation.
    const std::optional<int> nnodes = read_int(getenv, "SLURM_NNODES", 1);
    RG_CHECK(!nnodes || *nnodes == 1, "SLURM_NNODES=", *nnodes,
             " but none of SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE, "
             "SLURM_NTASKS_PER_NODE is set: cannot tell how many tasks run on this node");
  }
  finish_ranks(v, env);
  env.source = "slurm";
}

void read_openmpi(const Getenv& getenv, LaunchEnv& env) {
  RankVars v = read_rank_pair(getenv, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  v.local_rank_name = "OMPI_COMM_WORLD_LOCAL_RANK";
  v.local_world_name = "OMPI_COMM_WORLD_LOCAL_SIZE";
  v.local_rank = read_int(getenv, v.local_rank_name, 0);
  v.local_world_size = read_int(getenv, v.local_world_name, 1);
  finish_ranks(v, env);
  env.source = "openmpi";
}

bool any_set(const Getenv& getenv, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (lookup(getenv, name)) return true;
  }
  return false;
}

}  // namespace

LaunchEnv read_launch_env(
    const std::function<std::optional<std::string>(const std::string&)>& getenv_fn) {
  const Getenv getenv = getenv_fn ? getenv_fn : [](const std::string& name) {
    const char* value = std::getenv(name.c_str());
    return value ? std::optional<std::string>(value) : std::nullopt;
  };

  LaunchEnv env;
  // torchrun's variables win: a ringgrad-run started inside srun or mpirun gives its workers
  // RANK etc. while they still inherit the outer launcher's variables.
  if (any_set(getenv, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"})) {
    RG_CHECK(any_set(getenv, {"RANK", "WORLD_SIZE"}),
             "LOCAL_RANK or LOCAL_WORLD_SIZE is set but RANK and WORLD_SIZE are not");
    read_torchrun(getenv, env);
  } else if (lookup(getenv, "SLURM_PROCID")) {
    read_slurm(getenv, env);
  } else if (any_set(getenv, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"})) {
    read_openmpi(getenv, env);
  } else {
    env.source = "default";
  }

  // The store's address. When every rank runs on this node, loopback is right; across nodes
  // there is no safe guess, so MASTER_ADDR must say where rank 0's store is.
  if (std::optional<std::string> addr = lookup(getenv, "MASTER_ADDR")) {
    env.master_addr = *addr;
  } else {
    RG_CHECK(env.local_world_size == env.world_size, "MASTER_ADDR is not set but the job spans ",
             "several nodes (", env.world_size, " ranks, ", env.local_world_size,
             " on this node); export MASTER_ADDR=<host of rank 0> (under Slurm e.g. the first "
             "host of $SLURM_JOB_NODELIST)");
  }
  int port = kDefaultPort;
  if (std::optional<std::string> text = lookup(getenv, "MASTER_PORT")) {
    port = parse_int("MASTER_PORT", *text);
    RG_CHECK(port >= 1 && port <= 65535, "MASTER_PORT=", *text, " is not a port (1-65535)");
  }
  env.port = static_cast<uint16_t>(port);

  env.token = lookup(getenv, "RG_STORE_TOKEN").value_or("");
  if (std::optional<std::string> v = lookup(getenv, "RG_LAUNCHER_STORE")) {
    RG_CHECK(*v == "0" || *v == "1", "RG_LAUNCHER_STORE='", *v, "' must be 0 or 1");
    env.launcher_store = *v == "1";
  }
  // TORCHELASTIC_RESTART_COUNT lets programs started by torchrun itself see their generation.
  if (std::optional<int> n = read_int(getenv, "RG_RESTART_COUNT", 0)) {
    env.restart_count = *n;
  } else if (std::optional<int> m = read_int(getenv, "TORCHELASTIC_RESTART_COUNT", 0)) {
    env.restart_count = *m;
  }
  return env;
}

}  // namespace rg::dist
