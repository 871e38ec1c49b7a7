// dist::spawn (comm/spawn.h): fork + exec of the program per rank (kernels/cpu/self_exec.h: its
// own file and name, the parent's arguments); each child reports through a pipe inherited as
// RG_SPAWN_RESULT_FD: "ok\n<result>" or "error\n<message>".
#include "comm/spawn.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string_view>
#include <thread>

#include "comm/socket.h"
#include "kernels/cpu/self_exec.h"
#include "kernels/error.h"

extern char** environ;

namespace rg::dist {
namespace {

const char* kRankVar = "RG_SPAWN_RANK";
const char* kFdVar = "RG_SPAWN_RESULT_FD";

// This program's arguments, as the kernel has them.
std::vector<std::string> own_argv() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  RG_CHECK(!args.empty(), "spawn: cannot read /proc/self/cmdline");
  return args;
}


void write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = ::write(fd, s.data(), s.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    s.remove_prefix(size_t(n));
  }
}

// In a spawned child: run fn and leave with its report.
[[noreturn]] void run_child(int rank, int fd, const std::function<std::string(int)>& fn) {
  int code = 0;
  try {
    const std::string result = fn(rank);
    write_all(fd, "ok\n" + result);
  } catch (const std::exception& e) {
    write_all(fd, std::string("error\n") + e.what());
    code = 1;
  } catch (...) {
    write_all(fd, "error\nan exception that is not a std::exception");
    code = 1;
  }
  ::close(fd);
  std::fflush(nullptr);
  std::exit(code);  // static destructors run (the store host leaves cleanly)
}

struct Child {
  pid_t pid = -1;
  int fd = -1;
  std::string report;
  bool exited = false;
  int status = 0;
};

std::string describe(const Child& c) {
  if (c.report.rfind("error\n", 0) == 0) return c.report.substr(6);
  if (WIFSIGNALED(c.status))
    return std::string("killed by signal ") + std::to_string(WTERMSIG(c.status)) + " (" +
           strsignal(WTERMSIG(c.status)) + ")";
  if (WIFEXITED(c.status) && WEXITSTATUS(c.status) != 0)
    return "exited with code " + std::to_string(WEXITSTATUS(c.status));
  return "exited without reaching spawn() (does the program call it the same way every time?)";
}

}  // namespace

bool is_spawned_child() { return std::getenv(kRankVar) != nullptr; }

std::vector<std::string> spawn(int nprocs, const std::function<std::string(int rank)>& fn,
                               SpawnOptions options) {
  RG_CHECK(nprocs >= 1, "spawn: nprocs must be at least 1, got ", nprocs);
  if (const char* r = std::getenv(kRankVar)) {
    const char* f = std::getenv(kFdVar);
    RG_CHECK(f != nullptr, "spawn: ", kRankVar, " is set but ", kFdVar, " is not");
    const int rank = std::atoi(r), fd = std::atoi(f);
    ::unsetenv(kRankVar);  // a spawn inside fn starts a job of its own
    ::unsetenv(kFdVar);
    kernels::cpu::restore_program_name();  // only after exec_self's fallback (self_exec.h)
    run_child(rank, fd, fn);
  }
  const std::vector<std::string> argv_s = own_argv();
  const std::string port = std::to_string(net::free_loopback_port());
  // Everything built before fork(): this process may have threads.
  std::vector<std::vector<std::string>> envs(static_cast<size_t>(nprocs));
  static const char* kOurs[] = {
      "RANK=",        "WORLD_SIZE=",        "LOCAL_RANK=",    "LOCAL_WORLD_SIZE=",  "MASTER_ADDR=",
      "MASTER_PORT=", "RG_LAUNCHER_STORE=", "RG_SPAWN_RANK=", "RG_SPAWN_RESULT_FD="};
  std::vector<std::string> inherited;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry = *e;
    bool ours = false;
    for (const char* p : kOurs) ours = ours || entry.rfind(p, 0) == 0;
    if (!ours) inherited.emplace_back(entry);
  }
  const int kChildFd = 100;  // where each child finds its end of the report pipe
  for (int r = 0; r < nprocs; ++r) {
    auto& env = envs[size_t(r)];
    env = inherited;
    for (const std::string& v :
         {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(nprocs),
          "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(nprocs),
          std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + port,
          std::string(kRankVar) + "=" + std::to_string(r),
          std::string(kFdVar) + "=" + std::to_string(kChildFd)})
      env.push_back(v);
  }
  std::vector<Child> children(static_cast<size_t>(nprocs));
  const auto stop_all = [&] {
    for (Child& c : children)
      if (c.pid > 0 && !c.exited) ::kill(c.pid, SIGTERM);
    const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (Child& c : children) {
      while (c.pid > 0 && !c.exited) {
        if (::waitpid(c.pid, &c.status, WNOHANG) == c.pid) {
          c.exited = true;
        } else if (std::chrono::steady_clock::now() > grace) {
          ::kill(c.pid, SIGKILL);
          ::waitpid(c.pid, &c.status, 0);
          c.exited = true;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      if (c.fd >= 0) ::close(c.fd);
      c.fd = -1;
    }
  };
  for (int r = 0; r < nprocs; ++r) {
    int p[2];
    RG_CHECK(::pipe2(p, O_CLOEXEC) == 0, "spawn: pipe failed: ", std::strerror(errno));
    std::vector<char*> argv, envp;
    std::vector<std::string> a = argv_s;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : envs[size_t(r)]) envp.push_back(s.data());
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the ranks do not outlive the caller
      if (::getppid() != parent) ::_exit(1);
      ::dup2(p[1], kChildFd);  // without O_CLOEXEC: survives exec
      // Not execve("/proc/self/exe"): the ranks would be named "exe" in ps and pgrep -x.
      kernels::cpu::exec_self(argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(p[1]);
    if (pid < 0) {
      ::close(p[0]);
      stop_all();
      RG_FAIL("spawn: fork failed for rank ", r, ": ", std::strerror(errno));
    }
    children[size_t(r)] = {pid, p[0], "", false, 0};
  }
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration<double>(options.timeout_s > 0 ? options.timeout_s : 1e9);
  int running = nprocs;
  while (running > 0) {
    std::vector<pollfd> fds;
    for (const Child& c : children)
      if (c.fd >= 0) fds.push_back({c.fd, POLLIN, 0});
    if (!fds.empty())
      ::poll(fds.data(), fds.size(), 20);
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (Child& c : children) {
      if (c.fd >= 0) {
        char buf[4096];
        const ssize_t n = ::read(c.fd, buf, sizeof(buf));
        if (n > 0) c.report.append(buf, size_t(n));
        if (n == 0) {
          ::close(c.fd);
          c.fd = -1;
        }
      }
      if (!c.exited && c.fd < 0 && ::waitpid(c.pid, &c.status, 0) == c.pid) {
        c.exited = true;
        --running;
        const bool ok =
            WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0 && c.report.rfind("ok\n", 0) == 0;
        if (!ok) {
          const int rank = int(&c - children.data());
          const std::string why = describe(c);
          stop_all();
          RG_FAIL("spawn: rank ", rank, " of ", nprocs, " failed: ", why);
        }
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      stop_all();
      RG_FAIL("spawn: the ranks did not finish within ", options.timeout_s, " s");
    }
  }
  std::vector<std::string> results;
  for (const Child& c : children) results.push_back(c.report.substr(3));
  return results;
}

}  // namespace rg::dist
