// Programs keep their names: every program re-executes itself once at start to fix its OpenMP and
// OpenBLAS environment (kernels/cpu/runtime_env.h), which through /proc/self/exe named it "exe" in
// ps, top and pgrep -x (kernels/cpu/self_exec.h). A running ringgrad-train, ringgrad-bench and the
// workers of a 2-rank ringgrad-run job are looked at through /proc after their re-exec (seen by
// RG_ENV_APPLIED in /proc/PID/environ, so the tests cannot pass by looking too early): the name
// (/proc/PID/comm, what pgrep -x matches) and argv[0] of /proc/PID/cmdline must be their own.
// Everything started is killed at the end of each test.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "support/processes.h"
#include "support/scratch_dir.h"

extern char** environ;

namespace rg {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string proc_file(pid_t pid, const char* name) {
  return testing::file_contents(fs::path("/proc") / std::to_string(pid) / name);
}

// /proc/PID/comm without its newline.
std::string comm_of(pid_t pid) {
  std::string s = proc_file(pid, "comm");
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// The NUL-separated entries of /proc/PID/cmdline or /proc/PID/environ.
std::vector<std::string> entries_of(pid_t pid, const char* name) {
  const std::string s = proc_file(pid, name);
  std::vector<std::string> out;
  for (size_t b = 0; b < s.size();) {
    const size_t e = s.find('\0', b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    b = e == std::string::npos ? s.size() : e + 1;
  }
  return out;
}

// True once the process runs the image ensure_runtime_env re-executed: its environ, as execve gave
// it, holds the marker. Started without it, so a first image lacks it; checked once the process
// runs `program` (argv[0]), since a child between fork and execve still has its parent's
// environment (this test's own has the marker).
bool reexecuted(pid_t pid, const std::string& program) {
  const std::vector<std::string> cmdline = entries_of(pid, "cmdline");
  if (cmdline.empty() || cmdline[0] != program) return false;
  for (const std::string& e : entries_of(pid, "environ"))
    if (e == "RG_ENV_APPLIED=1") return true;
  return false;
}

// Processes whose parent is `parent` (field 4 of /proc/PID/stat, after the parenthesized name).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator("/proc", ec)) {
    const std::string name = d.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = testing::file_contents(d.path() / "stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent)
      out.push_back(pid_t(std::stoi(name)));
  }
  return out;
}

// True while the process runs (it exists and is not a zombie).
bool alive(pid_t pid) {
  const std::string stat = proc_file(pid, "stat");
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

// The name the kernel gives a program file: its base name, cut to 15 characters.
std::string kernel_name(const std::string& path) {
  return fs::path(path).filename().string().substr(0, 15);
}

// A program started in its own process group, with its output in a log; the group is killed and
// the program reaped when this goes out of scope.
class Started {
 public:
  Started(const std::vector<std::string>& args, const fs::path& log) : log_(log) {
    // Without the variables that would skip the re-exec, so that it happens (GOMP_SPINCOUNT unset
    // always makes ensure_runtime_env re-execute), and without another job's.
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      bool drop = false;
      for (const auto& p : testing::launch_variable_prefixes()) drop |= entry.rfind(p, 0) == 0;
      for (const char* p : {"RG_ENV_APPLIED=", "RG_NO_REEXEC=", "GOMP_SPINCOUNT=",
                            "OMP_WAIT_POLICY=", "RG_NUM_THREADS="})
        drop |= entry.rfind(p, 0) == 0;
      if (!drop) env.push_back(entry);
    }
    env.push_back("RG_NUM_THREADS=1");
    std::vector<std::string> a = args;
    std::vector<char*> argv, envp;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    const std::string log_path = log.string();
    pid_ = ::fork();
    if (pid_ < 0) ADD_FAILURE() << "fork failed";
    if (pid_ == 0) {
      ::setpgid(0, 0);
      const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
  }
  ~Started() {
    if (pid_ <= 0 || exited_) return;  // no group to kill (a reaped leader's id may be reused)
    ::kill(-pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  Started(const Started&) = delete;
  Started& operator=(const Started&) = delete;

  pid_t pid() const { return pid_; }
  bool exited() {
    int status = 0;
    return exited_ || pid_ <= 0 || (exited_ = ::waitpid(pid_, &status, WNOHANG) == pid_);
  }
  std::string log() const { return testing::file_contents(log_); }

  // Polls `ready` every 20 ms until it holds (true), the program exits or 60 s pass (false).
  bool wait_for(const std::function<bool()>& ready) {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline && !exited()) {
      if (ready()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  fs::path log_;
};

class ProcessNames : public testing::ScratchDirTest {
 protected:
  // Starts `args` alone and expects the running program, after its re-exec, to be named after
  // args[0] with args[0] as its argv[0].
  void expect_own_name(const std::vector<std::string>& args) {
    Started p(args, dir_ / "out.log");
    ASSERT_TRUE(p.wait_for([&] { return reexecuted(p.pid(), args[0]); }))
        << args[0] << " exited or did not re-execute itself within 60 s:\n"
        << p.log();
    EXPECT_EQ(comm_of(p.pid()), kernel_name(args[0]));
    const std::vector<std::string> cmdline = entries_of(p.pid(), "cmdline");
    ASSERT_FALSE(cmdline.empty());
    EXPECT_EQ(cmdline[0], args[0]);
    EXPECT_EQ(cmdline, args);
  }
};

TEST_F(ProcessNames, TrainKeepsItsName) {
  expect_own_name({RG_TRAIN_BINARY, "--dataset", "synthetic", "--model", "mlp", "--max-steps",
                   "1000000", "--batch-size", "16", "--workers", "0"});
}

TEST_F(ProcessNames, BenchKeepsItsName) {
  expect_own_name({RG_BENCH_BINARY, "train", "--model", "mlp", "--batch-size", "8", "--threads",
                   "1", "--warmup", "1000000"});
}

// `pgrep -x ringgrad-train` finds both ranks of a running job.
TEST_F(ProcessNames, LauncherWorkersKeepTheirNames) {
  Started run({RG_RUN_BINARY, "--nproc-per-node", "2", "--master-port", "0", RG_TRAIN_BINARY,
               "--dataset", "synthetic", "--model", "mlp", "--max-steps", "1000000", "--batch-size",
               "16", "--workers", "0"},
              dir_ / "out.log");
  std::vector<pid_t> workers;
  const bool ready = run.wait_for([&] {
    workers = children_of(run.pid());
    if (workers.size() != 2) return false;
    for (pid_t w : workers)
      if (!reexecuted(w, RG_TRAIN_BINARY)) return false;
    return true;
  });
  ASSERT_TRUE(ready) << "no 2 re-executed workers within 60 s (" << workers.size() << " seen):\n"
                     << run.log();
  EXPECT_EQ(comm_of(run.pid()), "ringgrad-run");
  for (pid_t w : workers) {
    EXPECT_EQ(comm_of(w), kernel_name(RG_TRAIN_BINARY)) << "worker " << w;
    const std::vector<std::string> cmdline = entries_of(w, "cmdline");
    ASSERT_FALSE(cmdline.empty());
    EXPECT_EQ(cmdline[0], RG_TRAIN_BINARY) << "worker " << w;
  }
  // The workers die with the launcher (PR_SET_PDEATHSIG in ringgrad-run); wait until they have,
  // so that no rank outlives the test.
  if (!run.exited()) ::kill(-run.pid(), SIGKILL);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (pid_t w : workers)
    while (alive(w) && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (pid_t w : workers) EXPECT_FALSE(alive(w)) << "worker " << w << " outlived its launcher";
}

}  // namespace
}  // namespace rg
