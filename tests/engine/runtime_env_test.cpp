// ensure_runtime_env (kernels/cpu/runtime_env.h) re-executes a program with the thread-waiting
// policies it needs before OpenMP and OpenBLAS start, and keeps what the user set:
// rg_spawn_check env (tests/apps/spawn_check.cpp) prints the variables its re-executed image sees.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/processes.h"
#include "support/scratch_dir.h"

namespace {

// Each test's process logs in a directory of its own (ctest runs the tests in parallel).
class RuntimeEnv : public rg::testing::ScratchDirTest {
 protected:
  std::string runtime_env_of(const std::vector<std::string>& set) const;
};

// rg_spawn_check env without any of the variables that skip the re-exec or that it sets (this
// test program has them from its own start), plus `set` ("NAME=value").
std::string RuntimeEnv::runtime_env_of(const std::vector<std::string>& set) const {
  std::vector<std::string> argv = {"/usr/bin/env"};
  for (const char* v : {"RG_ENV_APPLIED", "RG_NO_REEXEC", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY",
                        "OPENBLAS_THREAD_TIMEOUT", "GOTO_THREAD_TIMEOUT"})
    argv.insert(argv.end(), {"-u", v});
  argv.insert(argv.end(), set.begin(), set.end());
  argv.insert(argv.end(), {RG_SPAWN_CHECK, "env"});
  const auto r = rg::testing::run_processes({{argv, {}}}, dir_, 60)[0];
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return r.out;
}

bool has_line(const std::string& out, const std::string& line) {
  return ("\n" + out).find("\n" + line + "\n") != std::string::npos;
}

TEST_F(RuntimeEnv, IdleBlasAndOpenMpWorkersSpinBrieflyThenSleep) {
  const std::string out = runtime_env_of({});
  EXPECT_TRUE(has_line(out, "RG_ENV_APPLIED=1")) << out;
  EXPECT_TRUE(has_line(out, "GOMP_SPINCOUNT=2000")) << out;
  EXPECT_TRUE(has_line(out, "OPENBLAS_THREAD_TIMEOUT=4")) << out;
}

TEST_F(RuntimeEnv, WhatTheUserSetIsKept) {
  const std::string out = runtime_env_of({"OPENBLAS_THREAD_TIMEOUT=28", "GOMP_SPINCOUNT=7"});
  EXPECT_TRUE(has_line(out, "OPENBLAS_THREAD_TIMEOUT=28")) << out;
  EXPECT_TRUE(has_line(out, "GOMP_SPINCOUNT=7")) << out;
  // OpenBLAS reads GOTO_THREAD_TIMEOUT where OPENBLAS_THREAD_TIMEOUT is unset: no default then.
  const std::string goto_out = runtime_env_of({"GOTO_THREAD_TIMEOUT=28"});
  EXPECT_TRUE(has_line(goto_out, "OPENBLAS_THREAD_TIMEOUT unset")) << goto_out;
}

}  // namespace
