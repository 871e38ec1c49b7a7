// Child processes for the tests that start real programs (ringgrad-train, ringgrad-run): all of
// a list started at once, each with its own extra environment, stdout and stderr captured into a
// file, every one killed if it outlives the timeout.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace rg::testing {

struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0] is the program's path
  std::vector<std::string> env;   // "NAME=value" added to (or replacing in) the environment
};

struct ProcessResult {
  int exit_code = -1;  // 128 + N when killed by signal N
  std::string out;     // stdout and stderr together
  bool timed_out = false;
};

// Variables that describe a job; a test's processes start without this process's values.
inline const std::vector<std::string>& launch_variable_prefixes() {
  static const std::vector<std::string> v = {
      "RANK=",           "WORLD_SIZE=",        "LOCAL_RANK=",       "LOCAL_WORLD_SIZE=",
      "MASTER_ADDR=",    "MASTER_PORT=",       "SLURM_",            "OMPI_",
      "RG_STORE_TOKEN=", "RG_LAUNCHER_STORE=", "RG_RESTART_COUNT=", "RG_HEARTBEAT_FD=",
      "RG_TEST_FAULT="};
  return v;
}

// Starts every spec at once (logs in `dir`), waits for all; each is SIGKILLed after timeout_s.
inline std::vector<ProcessResult> run_processes(const std::vector<ProcessSpec>& specs,
                                                const std::filesystem::path& dir,
                                                double timeout_s = 120) {
  std::vector<pid_t> pids;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      bool drop = false;
      for (const auto& p : launch_variable_prefixes()) drop = drop || entry.rfind(p, 0) == 0;
      for (const auto& added : specs[i].env)
        drop = drop || entry.rfind(added.substr(0, added.find('=') + 1), 0) == 0;
      if (!drop) env.push_back(entry);
    }
    env.insert(env.end(), specs[i].env.begin(), specs[i].env.end());
    std::vector<std::string> args = specs[i].argv;
    std::vector<char*> argv, envp;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    const std::string log = (dir / ("process" + std::to_string(i) + ".log")).string();
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<ProcessResult> results(pids.size());
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    while (::waitpid(pids[i], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        results[i].timed_out = true;
        ::kill(pids[i], SIGKILL);
        ::waitpid(pids[i], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    results[i].exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    std::ifstream in(dir / ("process" + std::to_string(i) + ".log"));
    std::stringstream ss;
    ss << in.rdbuf();
    results[i].out = ss.str();
  }
  return results;
}

}  // namespace rg::testing
