// Tests of the launch contract (read_launch_env): the torchrun, Slurm and Open MPI variables,
// the single-process default, and a clear error for every malformed or inconsistent value.
#include "comm/env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "support/errors.h"

namespace rg::dist {
namespace {

using Vars = std::map<std::string, std::string>;
using rg::testing::expect_error;

LaunchEnv read(const Vars& vars) {
  return read_launch_env([&](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

void expect_read_error(const Vars& vars, const std::string& fragment) {
  expect_error([&] { read(vars); }, fragment);
}

TEST(LaunchEnvTest, DefaultIsOneProcess) {
  const LaunchEnv env = read({});
  EXPECT_EQ(env.source, "default");
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.port, 29500);
  EXPECT_EQ(env.token, "");
  EXPECT_EQ(env.restart_count, 0);
}

TEST(LaunchEnvTest, DefaultStillReadsStoreAddressTokenAndRestartCount) {
  const LaunchEnv env = read({{"MASTER_ADDR", "10.0.0.7"},
                              {"MASTER_PORT", "1234"},
                              {"RG_STORE_TOKEN", "abc"},
                              {"RG_RESTART_COUNT", "2"}});
  EXPECT_EQ(env.source, "default");
  EXPECT_EQ(env.master_addr, "10.0.0.7");
  EXPECT_EQ(env.port, 1234);
  EXPECT_EQ(env.token, "abc");
  EXPECT_EQ(env.restart_count, 2);
}

// RG_LAUNCHER_STORE=1 (ringgrad-run): the launcher hosts the store; otherwise rank 0 does.
TEST(LaunchEnvTest, LauncherStoreFlag) {
  EXPECT_FALSE(read({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).launcher_store);
  EXPECT_TRUE(
      read({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"RG_LAUNCHER_STORE", "1"}}).launcher_store);
  expect_error(
      [] {
        read({{"RG_LAUNCHER_STORE", "yes"}});
      },
      "RG_LAUNCHER_STORE='yes' must be 0 or 1");
}

TEST(LaunchEnvTest, Torchrun) {
  const LaunchEnv env = read({{"RANK", "5"},
                              {"LOCAL_RANK", "1"},
                              {"WORLD_SIZE", "8"},
                              {"LOCAL_WORLD_SIZE", "4"},
                              {"MASTER_ADDR", "node0"},
                              {"MASTER_PORT", "29501"},
                              {"RG_STORE_TOKEN", "t0k"},
                              {"RG_RESTART_COUNT", "1"}});
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.port, 29501);
  EXPECT_EQ(env.token, "t0k");
  EXPECT_EQ(env.restart_count, 1);
}

TEST(LaunchEnvTest, TorchrunWithoutLocalVariablesIsOneNode) {
  const LaunchEnv env = read({{"RANK", "2"}, {"WORLD_SIZE", "3"}});
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.local_world_size, 3);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.port, 29500);
}

TEST(LaunchEnvTest, TorchrunLocalRankWithoutLocalWorldSizeUsesWorldSize) {
  const LaunchEnv env = read({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"LOCAL_RANK", "2"}});
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.local_world_size, 3);
}

TEST(LaunchEnvTest, HeterogeneousNodesAreAllowed) {
  // 3 ranks on this node, 5 in all: not a multiple, as torchrun allows.
  const LaunchEnv env = read({{"RANK", "4"},
                              {"LOCAL_RANK", "2"},
                              {"WORLD_SIZE", "5"},
                              {"LOCAL_WORLD_SIZE", "3"},
                              {"MASTER_ADDR", "h"}});
  EXPECT_EQ(env.world_size, 5);
  EXPECT_EQ(env.local_world_size, 3);
}

TEST(LaunchEnvTest, EmptyValueCountsAsUnset) {
  const LaunchEnv env = read({{"RANK", ""}, {"WORLD_SIZE", ""}, {"MASTER_PORT", ""}});
  EXPECT_EQ(env.source, "default");
  EXPECT_EQ(env.port, 29500);
}

TEST(LaunchEnvTest, TorchelasticRestartCountIsTheFallback) {
  EXPECT_EQ(read({{"TORCHELASTIC_RESTART_COUNT", "3"}}).restart_count, 3);
  EXPECT_EQ(read({{"TORCHELASTIC_RESTART_COUNT", "3"}, {"RG_RESTART_COUNT", "1"}}).restart_count,
            1);
}

TEST(LaunchEnvTest, Slurm) {
  const LaunchEnv env = read({{"SLURM_PROCID", "6"},
                              {"SLURM_LOCALID", "2"},
                              {"SLURM_NTASKS", "8"},
                              {"SLURM_NTASKS_PER_NODE", "4"},
                              {"SLURM_NNODES", "2"},
                              {"MASTER_ADDR", "n1"}});
  EXPECT_EQ(env.source, "slurm");
  EXPECT_EQ(env.rank, 6);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "n1");
  EXPECT_EQ(env.port, 29500);
}

TEST(LaunchEnvTest, SlurmTaskListWithRepeats) {
  const Vars base = {{"SLURM_PROCID", "9"},  {"SLURM_LOCALID", "1"},
                     {"SLURM_NTASKS", "10"}, {"SLURM_TASKS_PER_NODE", "4(x2),2"},
                     {"SLURM_NODEID", "2"},  {"MASTER_ADDR", "n0"}};
  EXPECT_EQ(read(base).local_world_size, 2);
  Vars node1 = base;
  node1["SLURM_NODEID"] = "1";
  node1["SLURM_PROCID"] = "5";
  EXPECT_EQ(read(node1).local_world_size, 4);
}

TEST(LaunchEnvTest, SlurmCommaTaskList) {
  const LaunchEnv env = read({{"SLURM_PROCID", "3"},
                              {"SLURM_LOCALID", "1"},
                              {"SLURM_NTASKS", "4"},
                              {"SLURM_TASKS_PER_NODE", "2,2"},
                              {"SLURM_NODEID", "1"},
                              {"MASTER_ADDR", "n0"}});
  EXPECT_EQ(env.local_world_size, 2);
}

TEST(LaunchEnvTest, SlurmStepListWinsOverJobList) {
  const LaunchEnv env = read({{"SLURM_PROCID", "0"},
                              {"SLURM_LOCALID", "0"},
                              {"SLURM_NTASKS", "2"},
                              {"SLURM_STEP_TASKS_PER_NODE", "2"},
                              {"SLURM_TASKS_PER_NODE", "4"},
                              {"SLURM_NTASKS_PER_NODE", "4"}});
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "127.0.0.1");  // every task on this node
}

TEST(LaunchEnvTest, SlurmOneNodeWithoutPerNodeCounts) {
  const LaunchEnv env = read({{"SLURM_PROCID", "1"}, {"SLURM_NPROCS", "2"}, {"SLURM_NNODES", "1"}});
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
}

TEST(LaunchEnvTest, TorchrunVariablesWinOverSlurm) {
  // ringgrad-run started by srun: its workers see both sets.
  const LaunchEnv env =
      read({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 1);
}

TEST(LaunchEnvTest, OpenMpi) {
  const LaunchEnv env = read({{"OMPI_COMM_WORLD_RANK", "3"},
                              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                              {"OMPI_COMM_WORLD_SIZE", "4"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                              {"MASTER_ADDR", "a"},
                              {"MASTER_PORT", "65535"}});
  EXPECT_EQ(env.source, "openmpi");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.port, 65535);
}

TEST(LaunchEnvTest, SlurmWinsOverOpenMpi) {
  EXPECT_EQ(read({{"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "1"},
                  {"OMPI_COMM_WORLD_RANK", "0"},
                  {"OMPI_COMM_WORLD_SIZE", "1"}})
                .source,
            "slurm");
}

TEST(LaunchEnvErrorTest, NotAnInteger) {
  expect_read_error({{"RANK", "one"}, {"WORLD_SIZE", "2"}}, "RANK='one' is not an integer");
  expect_read_error({{"RANK", "1x"}, {"WORLD_SIZE", "2"}}, "RANK='1x' is not an integer");
  expect_read_error({{"RANK", " 1"}, {"WORLD_SIZE", "2"}}, "RANK=' 1' is not an integer");
  expect_read_error({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}},
                    "WORLD_SIZE='99999999999' is not an integer");
  expect_read_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "x"}},
                    "LOCAL_RANK='x' is not an integer");
  expect_read_error({{"MASTER_PORT", "http"}}, "MASTER_PORT='http' is not an integer");
  expect_read_error({{"RG_RESTART_COUNT", "1.5"}}, "RG_RESTART_COUNT='1.5' is not an integer");
  expect_read_error({{"TORCHELASTIC_RESTART_COUNT", "z"}},
                    "TORCHELASTIC_RESTART_COUNT='z' is not an integer");
  expect_read_error({{"SLURM_PROCID", "a"}, {"SLURM_NTASKS", "2"}},
                    "SLURM_PROCID='a' is not an integer");
  expect_read_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "b"}},
                    "OMPI_COMM_WORLD_SIZE='b' is not an integer");
}

TEST(LaunchEnvErrorTest, Negative) {
  expect_read_error({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, "RANK=-1 must be non-negative");
  expect_read_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "-2"}},
                    "LOCAL_RANK=-2 must be non-negative");
  expect_read_error({{"RG_RESTART_COUNT", "-1"}}, "RG_RESTART_COUNT=-1 must be non-negative");
}

TEST(LaunchEnvErrorTest, SizeBelowOne) {
  expect_read_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0 must be at least 1");
  expect_read_error(
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "0"}},
      "LOCAL_WORLD_SIZE=0 must be at least 1");
  expect_read_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}},
                    "SLURM_NTASKS=0 must be at least 1");
}

TEST(LaunchEnvErrorTest, RankNotBelowWorldSize) {
  expect_read_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK=2 must be less than WORLD_SIZE=2");
  expect_read_error({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}},
                    "SLURM_PROCID=4 must be less than SLURM_NTASKS=4");
  expect_read_error({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "1"}},
                    "OMPI_COMM_WORLD_RANK=3 must be less than OMPI_COMM_WORLD_SIZE=1");
}

TEST(LaunchEnvErrorTest, LocalRankNotBelowLocalWorldSize) {
  expect_read_error({{"RANK", "3"},
                     {"WORLD_SIZE", "4"},
                     {"LOCAL_RANK", "2"},
                     {"LOCAL_WORLD_SIZE", "2"},
                     {"MASTER_ADDR", "h"}},
                    "LOCAL_RANK=2 must be less than LOCAL_WORLD_SIZE=2");
  expect_read_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}},
                    "LOCAL_RANK=2 must be less than WORLD_SIZE=2");
  expect_read_error({{"SLURM_PROCID", "1"},
                     {"SLURM_LOCALID", "3"},
                     {"SLURM_NTASKS", "4"},
                     {"SLURM_NTASKS_PER_NODE", "2"},
                     {"MASTER_ADDR", "h"}},
                    "SLURM_LOCALID=3 must be less than SLURM_NTASKS_PER_NODE=2");
  expect_read_error({{"OMPI_COMM_WORLD_RANK", "1"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                     {"MASTER_ADDR", "h"}},
                    "OMPI_COMM_WORLD_LOCAL_RANK=1 must be less than OMPI_COMM_WORLD_LOCAL_SIZE=1");
}

TEST(LaunchEnvErrorTest, LocalWorldSizeAboveWorldSize) {
  expect_read_error(
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "3"}},
      "LOCAL_WORLD_SIZE=3 must not exceed WORLD_SIZE=2");
}

TEST(LaunchEnvErrorTest, HalfOfAPair) {
  expect_read_error({{"RANK", "0"}}, "RANK=0 is set but WORLD_SIZE is not");
  expect_read_error({{"WORLD_SIZE", "2"}}, "WORLD_SIZE=2 is set but RANK is not");
  expect_read_error({{"LOCAL_RANK", "0"}},
                    "LOCAL_RANK or LOCAL_WORLD_SIZE is set but RANK and WORLD_SIZE are not");
  expect_read_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
                    "LOCAL_WORLD_SIZE=2 is set but LOCAL_RANK is not");
  expect_read_error({{"SLURM_PROCID", "0"}}, "SLURM_PROCID=0 is set but SLURM_NTASKS is not");
  expect_read_error({{"OMPI_COMM_WORLD_RANK", "0"}},
                    "OMPI_COMM_WORLD_RANK=0 is set but OMPI_COMM_WORLD_SIZE is not");
  expect_read_error({{"OMPI_COMM_WORLD_SIZE", "2"}},
                    "OMPI_COMM_WORLD_SIZE=2 is set but OMPI_COMM_WORLD_RANK is not");
}

TEST(LaunchEnvErrorTest, PortOutOfRange) {
  expect_read_error({{"MASTER_PORT", "0"}}, "MASTER_PORT=0 is not a port (1-65535)");
  expect_read_error({{"MASTER_PORT", "65536"}}, "MASTER_PORT=65536 is not a port (1-65535)");
  expect_read_error({{"MASTER_PORT", "-5"}}, "MASTER_PORT=-5 is not a port");
}

TEST(LaunchEnvErrorTest, MasterAddrMissingAcrossNodes) {
  expect_read_error(
      {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}},
      "MASTER_ADDR is not set but the job spans several nodes");
  expect_read_error({{"SLURM_PROCID", "0"},
                     {"SLURM_LOCALID", "0"},
                     {"SLURM_NTASKS", "4"},
                     {"SLURM_NTASKS_PER_NODE", "2"}},
                    "export MASTER_ADDR");
}

TEST(LaunchEnvErrorTest, SlurmTaskLists) {
  const Vars base = {
      {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "4"}, {"MASTER_ADDR", "h"}};
  for (const char* bad : {"4(x)", "x", "4(2)", "4(x2", "0", "2,,2", "4(x0)", "2,"}) {
    Vars v = base;
    v["SLURM_TASKS_PER_NODE"] = bad;
    v["SLURM_NODEID"] = "0";
    expect_read_error(v,
                      std::string("SLURM_TASKS_PER_NODE='") + bad + "' is not a Slurm task list");
  }
  Vars no_node = base;
  no_node["SLURM_TASKS_PER_NODE"] = "2(x2)";
  expect_read_error(no_node, "lists several nodes but SLURM_NODEID is not set");
  Vars far_node = no_node;
  far_node["SLURM_NODEID"] = "2";
  expect_read_error(far_node, "SLURM_NODEID=2 is not a node of SLURM_TASKS_PER_NODE='2(x2)'");
  Vars many_nodes = base;
  many_nodes["SLURM_NNODES"] = "2";
  expect_read_error(many_nodes, "cannot tell how many tasks run on this node");
}

}  // namespace
}  // namespace rg::dist
