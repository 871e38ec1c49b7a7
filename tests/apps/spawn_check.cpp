// dist::spawn end to end (ctest dist.spawn.*): `spawn_check ok` runs 3 ranks that meet through the
// store rank 0 hosts and all-reduce their rank + 1 (each must return 6); `spawn_check fail` runs 2
// ranks of which rank 1 throws, and spawn must report that rank and its message. One spawn per
// run, as comm/spawn.h asks. Prints PASS or what went wrong; exit code 0 only on PASS.
//
// `spawn_check names [--runtime-env] [--delete-self PATH]` (tests/comm/spawn_names_test.cpp): 2
// ranks report their name (/proc/self/comm, what pgrep -x matches) and argv[0], which must be the
// parent's, named after its file (kernels/cpu/self_exec.h). --runtime-env first calls
// ensure_runtime_env as the programs do (a re-exec of the parent). --delete-self PATH deletes this
// program's file first, PATH being that file (a copy the test made; anything else is refused), so
// that both re-execs must take self_exec's fallback through /proc/self/exe.
//
// `spawn_check env` (tests/engine/runtime_env_test.cpp) calls ensure_runtime_env as the programs
// do and prints the variables it manages as this image sees them (NAME=value, or NAME unset).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "comm/init.h"
#include "comm/spawn.h"
#include "engine/ops/factory.h"
#include "kernels/cpu/runtime_env.h"
#include "kernels/error.h"

namespace {

// "<name> <argv[0]>" of this process.
std::string name_and_argv0() {
  std::ifstream comm("/proc/self/comm"), cmdline("/proc/self/cmdline", std::ios::binary);
  std::string name, argv0;
  std::getline(comm, name);
  std::getline(cmdline, argv0, '\0');
  return name + " " + argv0;
}

int check_names(int argc, char** argv) {
  bool runtime_env = false;
  std::string delete_self;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runtime-env") {
      runtime_env = true;
    } else if (a == "--delete-self" && i + 1 < argc) {
      delete_self = argv[++i];
    } else {
      std::printf("FAIL: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  // Only the first image deletes: a re-executed one finds "<PATH> (deleted)" there.
  char self[4096] = {};
  if (!delete_self.empty() && !rg::dist::is_spawned_child() &&
      ::readlink("/proc/self/exe", self, sizeof(self) - 1) > 0 && delete_self == self &&
      ::unlink(self) != 0) {
    std::printf("FAIL: cannot delete %s\n", self);
    return 1;
  }
  if (runtime_env) rg::kernels::cpu::ensure_runtime_env(argc, argv);
  const std::vector<std::string> ranks = rg::dist::spawn(2, [](int) { return name_and_argv0(); });
  const std::string parent = name_and_argv0();
  const char* applied = std::getenv("RG_ENV_APPLIED");
  std::printf("parent: %s\nre-executed: %s\n", parent.c_str(), applied ? applied : "no");
  bool ok = parent.rfind("exe ", 0) != 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::printf("rank %zu: %s\n", r, ranks[r].c_str());
    ok = ok && ranks[r] == parent;
  }
  std::printf("%s\n", ok ? "PASS" : "FAIL: a name differs from the parent's, or is exe");
  return ok ? 0 : 1;
}

int print_runtime_env(int argc, char** argv) {
  rg::kernels::cpu::ensure_runtime_env(argc, argv);
  for (const char* v : {"RG_ENV_APPLIED", "GOMP_SPINCOUNT", "OPENBLAS_THREAD_TIMEOUT"}) {
    const char* value = std::getenv(v);
    if (value != nullptr) {
      std::printf("%s=%s\n", v, value);
    } else {
      std::printf("%s unset\n", v);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "names") return check_names(argc, argv);
  if (mode == "env") return print_runtime_env(argc, argv);
  if (mode == "ok") {
    const auto results = rg::dist::spawn(3, [](int rank) {
      auto pg = rg::dist::init_process_group();
      const rg::Tensor t = rg::full({4}, double(rank + 1));
      pg->all_reduce(t)->wait();
      const std::string out =
          std::to_string(int(t.to_vector<float>()[0])) + " from " + std::to_string(pg->rank());
      rg::dist::destroy_process_group();
      return out;
    });
    const bool ok = results == std::vector<std::string>{"6 from 0", "6 from 1", "6 from 2"};
    for (const auto& r : results) std::printf("result: %s\n", r.c_str());
    std::printf("%s\n", ok ? "PASS" : "FAIL: unexpected results");
    return ok ? 0 : 1;
  }
  if (mode == "fail") {
    try {
      rg::dist::spawn(2, [](int rank) -> std::string {
        if (rank == 1) throw rg::Error("boom at rank 1");
        return "fine";
      });
    } catch (const rg::Error& e) {
      const std::string m = e.what();
      const bool ok = m.find("spawn: rank 1 of 2 failed: boom at rank 1") != std::string::npos;
      std::printf("error: %s\n%s\n", m.c_str(), ok ? "PASS" : "FAIL: wrong message");
      return ok ? 0 : 1;
    }
    std::printf("FAIL: no error\n");
    return 1;
  }
  std::printf("usage: spawn_check ok|fail|env|names [--runtime-env] [--delete-self PATH]\n");
  return 2;
}
