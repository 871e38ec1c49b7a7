// dist::spawn's ranks keep the program's name: rg_spawn_check (tests/apps/spawn_check.cpp) runs 2
// ranks that report their /proc/self/comm (what ps and pgrep -x show) and argv[0], which must be
// the parent's and not "exe" (kernels/cpu/self_exec.h). Also with ensure_runtime_env's re-exec of
// the parent first, and with the program's file deleted before either re-exec, where both must
// go through /proc/self/exe and name the process after its file again.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/processes.h"

namespace {

namespace fs = std::filesystem;

class SpawnNames : public ::testing::Test {
 protected:
  // A copy of rg_spawn_check under another name, next to the original (a directory that allows
  // executing, unlike some /tmp), removed at the end.
  void SetUp() override {
    dir_ = fs::path(RG_SPAWN_CHECK).parent_path() /
           ("spawn_names_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    copy_ = dir_ / "rg-named-spawn";
    fs::copy_file(RG_SPAWN_CHECK, copy_);
    fs::permissions(copy_, fs::perms::owner_all, fs::perm_options::add);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `args` with none of the variables that would skip ensure_runtime_env's re-exec (this
  // test program has them set by its own; env(1) removes them and keeps args as they are);
  // expects PASS and these names.
  void expect_names(const std::vector<std::string>& args, const std::string& name,
                    bool reexecuted) {
    std::vector<std::string> argv = {"/usr/bin/env"};
    for (const char* v : {"RG_ENV_APPLIED", "RG_NO_REEXEC", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY"})
      argv.insert(argv.end(), {"-u", v});
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = rg::testing::run_processes({{argv, {}}}, dir_, 60)[0];
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("\nPASS\n"), std::string::npos) << r.out;
    const std::string who = name + " " + args[0];
    EXPECT_NE(r.out.find("parent: " + who + "\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rank 0: " + who + "\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rank 1: " + who + "\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::string("re-executed: ") + (reexecuted ? "1" : "no") + "\n"),
              std::string::npos)
        << r.out;
  }

  fs::path dir_, copy_;
};

TEST_F(SpawnNames, RanksHaveTheParentsName) {
  expect_names({RG_SPAWN_CHECK, "names"}, "rg_spawn_check", false);
}

TEST_F(SpawnNames, AfterTheRuntimeEnvReexec) {
  expect_names({copy_.string(), "names", "--runtime-env"}, "rg-named-spawn", true);
}

TEST_F(SpawnNames, ProgramFileDeleted) {
  expect_names({copy_.string(), "names", "--delete-self", copy_.string()}, "rg-named-spawn", false);
  EXPECT_FALSE(fs::exists(copy_)) << "the run did not delete its file: nothing was tested";
}

TEST_F(SpawnNames, ProgramFileDeletedBeforeTheRuntimeEnvReexec) {
  expect_names({copy_.string(), "names", "--runtime-env", "--delete-self", copy_.string()},
               "rg-named-spawn", true);
  EXPECT_FALSE(fs::exists(copy_)) << "the run did not delete its file: nothing was tested";
}

}  // namespace
