// ringgrad-run: starts one node's workers of a data-parallel job, like torchrun. Node 0 hosts the
// job's store; each worker gets the launch variables (comm/env.h) and its output lines prefixed
// with its rank; when one worker fails the others are stopped and, if restarts remain, all are
// started again. Before stopping them after a failure or a hang, it asks every worker for its
// flight recorder dump (comm/flight_recorder.h: SIGUSR1) and says where the dumps are.
//
// Exit codes: 0 every worker exited 0; otherwise the first failing worker's code (128+N when it
// died of signal N); 128+N when the launcher got signal N (forwarded to the workers first); 127
// the program was not found, 126 it could not be executed; 2 a bad command line; 1 any other
// launcher error (e.g. the store's port is taken).
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/prefix_store.h"
#include "comm/tcp_store.h"
#include "kernels/error.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNotExecutable = 126;
constexpr int kExitNotFound = 127;
// A line longer than this without a newline is forwarded in pieces, so that a worker printing
// binary junk cannot make the launcher buffer without bound.
constexpr size_t kMaxLineBytes = size_t(64) << 10;
// What is still read from a worker's pipe once the worker has exited (a pipe holds at most 1 MiB).
constexpr size_t kMaxDrainBytes = size_t(16) << 20;
// The signals the launcher forwards to its workers (torchrun handles the same four).
constexpr std::array<int, 4> kForwardedSignals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
// The descriptor a worker writes its heartbeats to (RG_HEARTBEAT_FD).
constexpr int kHeartbeatFd = 9;
// How long the workers get to write their flight recorder dumps before they are stopped (a dump
// takes milliseconds; a stopped worker never writes one).
constexpr auto kDumpWait = std::chrono::seconds(2);

struct Options {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int max_restarts = 0;
  int threads_per_worker = 0;  // 0: max(1, cores / nproc_per_node)
  double grace_period_s = 5.0;
  // A worker that has sent heartbeats (rg_comm sends one every 0.5 s, comm/heartbeat.h) and then
  // stays silent this long is stopped or hung: it is killed and counts as failed (0: off).
  double heartbeat_timeout_s = 30.0;
  // How long a launcher waits for the other nodes' launchers at the start and end of an attempt.
  double rdzv_timeout_s = 300.0;
  bool no_prefix = false;
  std::vector<std::string> command;  // PROGRAM ARGS...
};

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

// Writes all of `s`. Output nobody reads any more (a closed pipe: SIGPIPE is ignored) is dropped:
// whether the workers run to the end must not depend on the launcher's reader.
void write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = ::write(fd, s.data(), s.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    s.remove_prefix(static_cast<size_t>(n));
  }
}

// The launcher's own messages: one complete line each, through the same descriptor as the
// workers' stderr lines so that the two never split each other.
void say(const std::string& message) {
  write_all(STDERR_FILENO, "ringgrad-run: " + message + "\n");
}

std::string random_token() {
  std::random_device rd;
  std::string token;
  for (int i = 0; i < 4; ++i) token += fmt::format("{:08x}", rd());
  return token;
}

std::string errno_text(int err) { return std::strerror(err); }

// One worker pipe (its stdout or stderr): reads what is there and writes complete lines, each
// with the rank prefix, to the launcher's matching descriptor. A partial line waits for its
// newline (or for the pipe to close), so lines of different ranks never mix.
class LineForwarder {
 public:
  LineForwarder(int fd, int target, std::string prefix)
      : fd_(fd), target_(target), prefix_(std::move(prefix)) {}
  ~LineForwarder() { close(); }
  LineForwarder(const LineForwarder&) = delete;
  LineForwarder& operator=(const LineForwarder&) = delete;

  int fd() const { return fd_; }
  bool open() const { return fd_ >= 0; }

  // Reads until the pipe would block; on end of file flushes the partial line and closes.
  void read_available() {
    char chunk[65536];
    while (fd_ >= 0) {
      const ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n > 0) {
        buffer_.append(chunk, static_cast<size_t>(n));
        emit(false);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && errno == EAGAIN) {
        return;
      } else {
        close();
      }
    }
  }

  // Forwards whatever is still readable and the partial last line, then closes. Called once the
  // worker has exited: everything it wrote is in the pipe by then, while a grandchild that kept
  // the pipe open must not hold up the launcher.
  void close() {
    if (fd_ < 0) return;
    const int fd = fd_;
    fd_ = -1;
    char chunk[65536];
    ssize_t n = 0;
    size_t drained = 0;  // bounded: a grandchild could keep writing forever
    while (drained < kMaxDrainBytes &&
           ((n = ::read(fd, chunk, sizeof chunk)) > 0 || (n < 0 && errno == EINTR))) {
      if (n > 0) {
        buffer_.append(chunk, static_cast<size_t>(n));
        drained += static_cast<size_t>(n);
        emit(false);
      }
    }
    ::close(fd);
    emit(true);
  }

 private:
  void emit(bool flush_partial) {
    std::string out;
    size_t begin = 0;
    while (true) {
      const size_t newline = buffer_.find('\n', begin);
      if (newline == std::string::npos) break;
      out.append(prefix_).append(buffer_, begin, newline + 1 - begin);
      begin = newline + 1;
    }
    buffer_.erase(0, begin);
    if (!buffer_.empty() && (flush_partial || buffer_.size() >= kMaxLineBytes)) {
      out.append(prefix_).append(buffer_).push_back('\n');
      buffer_.clear();
    }
    if (!out.empty()) write_all(target_, out);
  }

  int fd_;
  int target_;
  std::string prefix_;
  std::string buffer_;
};

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;  // also the id of its process group
  bool running = false;
  std::unique_ptr<LineForwarder> out;
  std::unique_ptr<LineForwarder> err;
  int heartbeat_fd = -1;  // read end; the worker writes a byte every 0.5 s once rg_comm is up
  std::optional<Clock::time_point> last_beat;
  // It has sent a heartbeat: rg_comm is up, and with it the flight recorder's SIGUSR1 dump
  // (init_process_group installs both). Others get no SIGUSR1: it would kill them.
  bool has_recorder = false;
  bool dump_requested = false;
  ino_t dump_inode = 0;  // of its dump file when the dump was requested (0: none)
};

// The file a worker's flight recorder writes (comm/flight_recorder.h), and its inode (0: none).
std::string dump_path(const std::string& dir, int rank) {
  return fmt::format("{}/rank{}.json", dir, rank);
}

ino_t inode_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// Starts, watches, stops and restarts this node's workers; single-threaded around one poll()
// over the workers' pipes and a signalfd (SIGCHLD and the forwarded signals).
class Launcher {
 public:
  Launcher(const Options& options, std::string token, uint16_t port, int signal_fd,
           const sigset_t& worker_mask)
      : opt_(options),
        token_(std::move(token)),
        port_(port),
        signal_fd_(signal_fd),
        worker_mask_(worker_mask) {
    devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    RG_CHECK(devnull_ >= 0, "cannot open /dev/null: ", errno_text(errno));
    if (opt_.nnodes > 1) {
      // The launchers of all nodes agree on each attempt through the job's store (node 0's).
      rg::dist::TcpStoreOptions so;
      so.host = opt_.master_addr;
      so.port = port_;
      so.token = token_;
      so.timeout = rg::dist::Millis(int64_t(opt_.rdzv_timeout_s * 1000));
      so.connect_timeout = so.timeout;
      agents_ = std::make_unique<rg::dist::PrefixStore>("agents",
                                                        std::make_shared<rg::dist::TcpStore>(so));
      agents_->set_timeout(so.timeout);
    }
  }

  // Whatever happens (an exception included), no worker outlives the launcher.
  ~Launcher() {
    for (auto& w : workers_) {
      if (!w->running) continue;
      ::kill(-w->pid, SIGKILL);
      ::waitpid(w->pid, nullptr, 0);
    }
    for (auto& w : workers_)
      if (w->heartbeat_fd >= 0) ::close(w->heartbeat_fd);
    ::close(devnull_);
  }

  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Runs attempts until one succeeds, the restarts are spent, or the launcher is signalled.
  int run() {
    const int code = run_attempts();
    if (agents_) leave_agents();
    return code;
  }

 private:
  int run_attempts() {
    for (int restart = 0;; ++restart) {
      if (agents_) agents_barrier(restart, "start");
      run_attempt(restart);
      if (signal_ != 0) return 128 + signal_;
      if (exec_failure_code_ != 0) return exec_failure_code_;
      if (agents_) {
        // Every node's attempt ends before any decides: a failure anywhere restarts all.
        agents_barrier(restart, "end");
        if (!failure_code_ && agents_->check({gen_key(restart, "failed")})) failure_code_ = 1;
      }
      if (!failure_code_) return 0;
      if (restart >= opt_.max_restarts) return *failure_code_;
      handle_signals();  // a Ctrl-C that came in while the attempt ended must not restart it
      if (signal_ != 0) return 128 + signal_;
      say(fmt::format("restarting the workers (restart {} of {})", restart + 1, opt_.max_restarts));
    }
  }

 private:
  void run_attempt(int restart_count) {
    for (auto& w : workers_)
      if (w->heartbeat_fd >= 0) ::close(w->heartbeat_fd);
    workers_.clear();
    attempt_ = restart_count;
    stopping_ = false;
    dumping_ = false;
    hung_ = nullptr;
    // Each attempt's dumps in their own directory, so that a restart does not overwrite them (the
    // user's RG_FLIGHT_RECORDER_DIR is used as it is).
    const char* user_dir = std::getenv("RG_FLIGHT_RECORDER_DIR");
    flight_dir_override_ = user_dir == nullptr || *user_dir == '\0';
    flight_dir_ = flight_dir_override_
                      ? fmt::format("/tmp/ringgrad-flight/{}/attempt{}", ::getpid(), restart_count)
                      : user_dir;
    killed_ = false;
    failure_code_.reset();
    for (int local_rank = 0; local_rank < opt_.nproc_per_node; ++local_rank) {
      auto w = std::make_unique<Worker>();
      w->local_rank = local_rank;
      w->rank = opt_.node_rank * opt_.nproc_per_node + local_rank;
      const int exec_errno = start(*w, restart_count);
      workers_.push_back(std::move(w));
      if (exec_errno != 0) {
        // Every worker runs the same program, so there is no point starting the others.
        say(fmt::format("cannot run '{}': {}", opt_.command[0], errno_text(exec_errno)));
        exec_failure_code_ =
            (exec_errno == ENOENT || exec_errno == ENOTDIR) ? kExitNotFound : kExitNotExecutable;
        stop_all(SIGTERM);
        break;
      }
    }
    monitor();
  }

  std::vector<std::string> worker_env(const Worker& w, int restart_count) const {
    const int threads = opt_.threads_per_worker > 0
                            ? opt_.threads_per_worker
                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                              opt_.nproc_per_node);
    std::vector<std::pair<std::string, std::string>> vars = {
        {"RANK", std::to_string(w.rank)},
        {"LOCAL_RANK", std::to_string(w.local_rank)},
        {"WORLD_SIZE", std::to_string(opt_.nnodes * opt_.nproc_per_node)},
        {"LOCAL_WORLD_SIZE", std::to_string(opt_.nproc_per_node)},
        {"GROUP_RANK", std::to_string(opt_.node_rank)},
        {"GROUP_WORLD_SIZE", std::to_string(opt_.nnodes)},
        {"MASTER_ADDR", opt_.master_addr},
        {"MASTER_PORT", std::to_string(port_)},
        {"RG_STORE_TOKEN", token_},
        {"RG_LAUNCHER_STORE", "1"},
        {"RG_HEARTBEAT_FD", std::to_string(kHeartbeatFd)},
        {"RG_RESTART_COUNT", std::to_string(restart_count)},
        {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
        {"TORCHELASTIC_MAX_RESTARTS", std::to_string(opt_.max_restarts)},
        {"RG_NUM_THREADS", std::to_string(threads)},
        {"OMP_NUM_THREADS", std::to_string(threads)},
    };
    if (flight_dir_override_) vars.emplace_back("RG_FLIGHT_RECORDER_DIR", flight_dir_);
    std::set<std::string> ours;
    for (const auto& [name, value] : vars) ours.insert(name);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view entry = *e;
      if (!ours.contains(std::string(entry.substr(0, entry.find('='))))) env.emplace_back(entry);
    }
    for (const auto& [name, value] : vars) env.push_back(fmt::format("{}={}", name, value));
    return env;
  }

  // Forks and executes one worker. Returns 0, or the errno of a failed exec (the child then
  // exits and is reaped like any worker).
  int start(Worker& w, int restart_count) {
    // Everything the child needs is built before fork(): the store's thread may hold the
    // allocator's lock, so the child only makes async-signal-safe calls until exec.
    const std::vector<std::string> env = worker_env(w, restart_count);
    std::vector<char*> envp;
    envp.reserve(env.size() + 1);
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    std::vector<char*> argv;
    argv.reserve(opt_.command.size() + 1);
    for (const auto& a : opt_.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);

    int out[2], err[2], status[2], beat[2];
    RG_CHECK(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0 &&
                 ::pipe2(status, O_CLOEXEC) == 0 && ::pipe2(beat, O_CLOEXEC) == 0,
             "cannot create pipes: ", errno_text(errno));
    const pid_t launcher = ::getpid();
    const pid_t pid = ::fork();
    RG_CHECK(pid >= 0, "cannot fork: ", errno_text(errno));
    if (pid == 0) {
      // Own process group: stopping a worker signals everything it started, and a Ctrl-C on
      // the terminal reaches the launcher alone, which forwards it.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(kExitError);  // the launcher died before prctl
      ::sigprocmask(SIG_SETMASK, &worker_mask_, nullptr);
      ::signal(SIGPIPE, SIG_DFL);
      ::dup2(devnull_, STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      // Like torchrun's close_fds: the store's sockets and other launcher descriptors must not
      // leak into workers (older kernels lack the call; the pipes are O_CLOEXEC anyway).
      ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
      if (beat[1] == kHeartbeatFd) {
        ::fcntl(kHeartbeatFd, F_SETFD, 0);  // the worker keeps this one
      } else {
        ::dup2(beat[1], kHeartbeatFd);  // dup2 clears FD_CLOEXEC: the worker keeps this one
      }
      ::execvpe(argv[0], argv.data(), envp.data());
      const int e = errno;
      [[maybe_unused]] const ssize_t n = ::write(status[1], &e, sizeof e);
      ::_exit(kExitNotFound);
    }
    ::setpgid(pid, pid);  // also here, so the group exists before we may signal it
    ::close(out[1]);
    ::close(err[1]);
    ::close(status[1]);
    ::close(beat[1]);
    ::fcntl(beat[0], F_SETFL, O_NONBLOCK);
    w.heartbeat_fd = beat[0];
    int exec_errno = 0;
    ssize_t n = 0;
    while ((n = ::read(status[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
    }
    ::close(status[0]);
    if (n != static_cast<ssize_t>(sizeof exec_errno)) exec_errno = 0;  // EOF: exec succeeded
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);
    const std::string prefix = opt_.no_prefix ? "" : fmt::format("[rank {}] ", w.rank);
    w.out = std::make_unique<LineForwarder>(out[0], STDOUT_FILENO, prefix);
    w.err = std::make_unique<LineForwarder>(err[0], STDERR_FILENO, prefix);
    w.pid = pid;
    w.running = true;
    return exec_errno;
  }

  int running_count() const {
    int n = 0;
    for (const auto& w : workers_) n += w->running ? 1 : 0;
    return n;
  }

  // Signals every running worker's process group; the first call also starts the grace period
  // after which the survivors get SIGKILL.
  void stop_all(int sig) {
    for (const auto& w : workers_) {
      if (w->running) ::kill(-w->pid, sig);
    }
    if (!stopping_) {
      stopping_ = true;
      kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(opt_.grace_period_s));
    }
  }

  void kill_all() {
    stop_all(SIGKILL);
    killed_ = true;
  }

  // After a failure or a hang, before stopping the workers: asks each running worker that has a
  // flight recorder for its dump (SIGUSR1, to the worker alone: its children have none) and stops
  // them once every one has written it or kDumpWait has passed. `hung` (silent past the heartbeat
  // timeout) is asked too, since a hang often leaves the dump thread free, then killed.
  void stop_after_dumps(Worker* hung) {
    hung_ = hung;
    for (const auto& w : workers_) {
      w->dump_requested = false;
      if (!w->running) continue;
      drain_heartbeat(*w);
      if (!w->has_recorder) continue;
      w->dump_requested = true;
      // The file may be there already (an earlier dump): only a new one (a new inode, written by
      // rename) counts.
      w->dump_inode = inode_of(dump_path(flight_dir_, w->rank));
      ::kill(w->pid, SIGUSR1);
      dumping_ = true;
    }
    if (!dumping_) return finish_stop();
    dump_deadline_ = Clock::now() + kDumpWait;
  }

  bool dumps_written() const {
    for (const auto& w : workers_) {
      if (w->dump_requested && w->running &&
          inode_of(dump_path(flight_dir_, w->rank)) == w->dump_inode)
        return false;
    }
    return true;
  }

  // The dump wait is over: says where the dumps are and stops the workers.
  void finish_stop() {
    if (dumping_) {
      dumping_ = false;
      std::vector<int> missing;
      bool any = false;
      for (const auto& w : workers_) {
        if (!w->dump_requested) continue;
        const ino_t now = inode_of(dump_path(flight_dir_, w->rank));
        if (now != 0 && now != w->dump_inode) {
          any = true;
        } else {
          missing.push_back(w->rank);
        }
      }
      for (int rank : missing) {
        say(
            fmt::format("no flight recorder dump from rank {} within {} s (a stopped or exited "
                        "worker cannot write one)",
                        rank, std::chrono::seconds(kDumpWait).count()));
      }
      // A rank that failed on its own has dumped before it exited: its file counts too.
      for (const auto& w : workers_) any = any || inode_of(dump_path(flight_dir_, w->rank)) != 0;
      if (any) {
        say(fmt::format(
            "flight recorder dumps in {}; analyze with: ringgrad-bench flight {}/rank*.json",
            flight_dir_, flight_dir_));
      }
    }
    if (hung_ != nullptr && hung_->running) ::kill(-hung_->pid, SIGKILL);
    hung_ = nullptr;
    stop_all(SIGTERM);
  }

  void monitor() {
    while (running_count() > 0) {
      std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}};
      std::vector<LineForwarder*> streams;
      for (const auto& w : workers_) {
        for (LineForwarder* f : {w->out.get(), w->err.get()}) {
          if (f == nullptr || !f->open()) continue;
          fds.push_back({f->fd(), POLLIN, 0});
          streams.push_back(f);
        }
      }
      // Heartbeats and the other nodes are checked at least every 200 ms.
      const bool periodic = opt_.heartbeat_timeout_s > 0 || agents_;
      int timeout_ms = dumping_ ? 20 : periodic ? 200 : -1;  // dumps: checked every 20 ms
      if (stopping_ && !killed_) {
        const auto left = kill_deadline_ - Clock::now();
        const int until_kill = static_cast<int>(
            std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(left).count()));
        timeout_ms = timeout_ms < 0 ? until_kill : std::min(timeout_ms, until_kill);
      }
      const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
      RG_CHECK(ready >= 0 || errno == EINTR, "poll failed: ", errno_text(errno));
      for (size_t i = 1; ready > 0 && i < fds.size(); ++i) {
        if (fds[i].revents != 0) streams[i - 1]->read_available();
      }
      if (ready > 0 && fds[0].revents != 0) handle_signals();
      check_heartbeats();
      check_other_nodes();
      if (dumping_ && (Clock::now() >= dump_deadline_ || dumps_written())) finish_stop();
      if (stopping_ && !killed_ && Clock::now() >= kill_deadline_) kill_all();
    }
    if (dumping_) finish_stop();  // every worker exited while the dumps were awaited
  }

  void handle_signals() {
    bool child_exited = false;
    signalfd_siginfo info;
    while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) {
        child_exited = true;
      } else if (signal_ == 0) {
        signal_ = sig;
        if (running_count() > 0) {
          say(fmt::format("got {}; forwarding it to {} worker(s) and waiting up to {}s",
                          signal_name(sig), running_count(), opt_.grace_period_s));
        } else {
          say(fmt::format("got {}; stopping", signal_name(sig)));
        }
        stopping_ = false;  // a fresh grace period from now
        dumping_ = false;   // the signal wins over the dumps: it is forwarded now
        hung_ = nullptr;
        stop_all(sig);
      } else if (!killed_) {
        say(fmt::format("got {} again; killing the workers", signal_name(sig)));
        kill_all();
      }
    }
    if (child_exited) reap();
  }

  void reap() {
    for (const auto& w : workers_) {
      if (!w->running) continue;
      int status = 0;
      const pid_t r = ::waitpid(w->pid, &status, WNOHANG);
      if (r != w->pid) continue;
      w->running = false;
      w->out->close();
      w->err->close();
      const int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
      if (code == 0 || stopping_ || dumping_) continue;
      failure_code_ = code;
      const std::string how = WIFSIGNALED(status) ? fmt::format("was killed by {} (exit code {})",
                                                                signal_name(WTERMSIG(status)), code)
                                                  : fmt::format("exited with code {}", code);
      const int others = running_count();
      const std::string then = others == 0 ? ""
                               : others == 1
                                   ? "; stopping the other worker"
                                   : fmt::format("; stopping the other {} workers", others);
      say(fmt::format("rank {} (pid {}) {}{}", w->rank, w->pid, how, then));
      report_failure(fmt::format("rank {} on node {} {}", w->rank, opt_.node_rank, how));
      stop_after_dumps(nullptr);
    }
  }

  // Reads what the worker's heartbeat pipe holds; true when it beat.
  static bool drain_heartbeat(Worker& w) {
    if (w.heartbeat_fd < 0) return false;
    char buf[256];
    bool beat = false;
    while (::read(w.heartbeat_fd, buf, sizeof buf) > 0) beat = true;
    if (beat) w.has_recorder = true;
    return beat;
  }

  // Drains each worker's heartbeat pipe; a worker that has beaten and then went silent for
  // heartbeat_timeout_s (SIGSTOP, a hang with every thread stuck) is killed and counts as failed.
  void check_heartbeats() {
    if (opt_.heartbeat_timeout_s <= 0) return;
    const auto now = Clock::now();
    for (const auto& w : workers_) {
      if (!w->running || w->heartbeat_fd < 0) continue;
      if (drain_heartbeat(*w)) w->last_beat = now;
      if (!w->last_beat || stopping_ || dumping_) continue;
      const double silent = std::chrono::duration<double>(now - *w->last_beat).count();
      if (silent < opt_.heartbeat_timeout_s) continue;
      const std::string how =
          fmt::format("sent no heartbeat for {:.1f} s (stopped or hung); killing it", silent);
      say(fmt::format("rank {} (pid {}) {}", w->rank, w->pid, how));
      failure_code_ = failure_code_.value_or(kExitError);
      report_failure(fmt::format("rank {} on node {} {}", w->rank, opt_.node_rank, how));
      stop_after_dumps(w.get());
      w->last_beat.reset();
    }
  }

  // Multi-node: a failure on another node stops this node's workers too (torchrun's agents).
  void check_other_nodes() {
    if (!agents_ || stopping_ || dumping_) return;
    const auto now = Clock::now();
    if (now < next_agents_check_) return;
    next_agents_check_ = now + std::chrono::milliseconds(200);
    const std::string key = gen_key(attempt_, "failed");
    if (!agents_->check({key})) return;
    say(fmt::format("another node failed ({}); stopping this node's {} worker(s)",
                    agents_->get_string(key), running_count()));
    failure_code_ = failure_code_.value_or(kExitError);
    stop_after_dumps(nullptr);
  }

  void report_failure(const std::string& what) {
    if (!agents_) return;
    try {
      agents_->compare_set(gen_key(attempt_, "failed"), {}, rg::dist::to_bytes(what));
    } catch (const std::exception& e) {
      say(fmt::format("cannot tell the other nodes: {}", e.what()));
    }
  }

  static std::string gen_key(int attempt, const char* what) {
    return fmt::format("gen{}/{}", attempt, what);
  }

  // The job is over: node 0 hosts the store, so it waits (up to the rendezvous timeout) until the
  // other launchers are done with it; they say so and leave.
  void leave_agents() {
    try {
      if (opt_.node_rank != 0) {
        agents_->add("left", 1);
        return;
      }
      const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(opt_.rdzv_timeout_s));
      while (agents_->add("left", 0) < opt_.nnodes - 1 && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } catch (const std::exception& e) {
      say(fmt::format("leaving the job: {}", e.what()));
    }
  }

  // Waits until every node's launcher has reached `what` of attempt `attempt`.
  void agents_barrier(int attempt, const char* what) {
    const std::string key = gen_key(attempt, what);
    const int64_t here = agents_->add(key, 1);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(opt_.rdzv_timeout_s));
    int64_t seen = here;
    while (seen < opt_.nnodes) {
      RG_CHECK(Clock::now() < deadline, "node ", opt_.node_rank, ": only ", seen, " of ",
               opt_.nnodes, " launchers reached the ", what, " of attempt ", attempt, " within ",
               opt_.rdzv_timeout_s, " s (is a launcher missing or dead?)");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      seen = agents_->add(key, 0);
    }
  }

  const Options& opt_;
  const std::string token_;
  const uint16_t port_;
  const int signal_fd_;
  const sigset_t worker_mask_;
  int devnull_ = -1;
  std::vector<std::unique_ptr<Worker>> workers_;
  // The current attempt.
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_deadline_;
  // Waiting for the flight recorder dumps before stopping (stop_after_dumps); `hung_` is killed
  // then.
  bool dumping_ = false;
  Clock::time_point dump_deadline_;
  Worker* hung_ = nullptr;
  std::string flight_dir_;            // where this attempt's workers write their dumps
  bool flight_dir_override_ = false;  // set RG_FLIGHT_RECORDER_DIR for the workers
  std::optional<int> failure_code_;   // the first failing worker's exit code
  int attempt_ = 0;
  // Multi-node: the launchers' shared view of each attempt (node 0's store, prefix "agents/").
  std::unique_ptr<rg::dist::PrefixStore> agents_;
  Clock::time_point next_agents_check_;
  // The whole run.
  int signal_ = 0;  // the first signal the launcher got (then it stops for good)
  int exec_failure_code_ = 0;
};

// The command-line checks CLI11 cannot express; returns the problem, or "" when all is well.
std::string check_options(const Options& o) {
  if (o.nproc_per_node < 1) {
    return fmt::format("--nproc-per-node must be at least 1, got {}", o.nproc_per_node);
  }
  if (o.nnodes < 1) return fmt::format("--nnodes must be at least 1, got {}", o.nnodes);
  if (int64_t(o.nnodes) * o.nproc_per_node > (1 << 20)) {
    return fmt::format("--nnodes {} x --nproc-per-node {} is too many workers", o.nnodes,
                       o.nproc_per_node);
  }
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    return fmt::format("--node-rank must be in [0, {}), got {}", o.nnodes, o.node_rank);
  }
  if (o.master_addr.empty()) return "--master-addr must not be empty";
  if (o.master_port < 0 || o.master_port > 65535) {
    return fmt::format("--master-port must be in [0, 65535], got {}", o.master_port);
  }
  if (o.master_port == 0 && o.nnodes > 1) {
    return "--master-port 0 (pick a free port) needs --nnodes 1: the other nodes must know the "
           "port";
  }
  if (o.max_restarts < 0) return fmt::format("--max-restarts must be >= 0, got {}", o.max_restarts);
  if (o.heartbeat_timeout_s < 0) return "--heartbeat-timeout-s must be >= 0";
  if (o.rdzv_timeout_s <= 0) return "--rdzv-timeout-s must be positive";
  if (o.threads_per_worker < 0) {
    return fmt::format("--threads-per-worker must be >= 0, got {}", o.threads_per_worker);
  }
  if (!std::isfinite(o.grace_period_s) || o.grace_period_s < 0) {
    return fmt::format("--grace-period-s must be >= 0, got {}", o.grace_period_s);
  }
  if (o.command.empty()) return "missing PROGRAM: ringgrad-run [options] PROGRAM [ARGS...]";
  return "";
}

int usage_error(const std::string& message) {
  std::cerr << "ringgrad-run: " << message << " (see --help)\n";
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "ringgrad-run [options] PROGRAM [ARGS...]: start this node's workers of a data-parallel "
      "job, like torchrun"};
  app.footer(
      "Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,\n"
      "MASTER_PORT, RG_STORE_TOKEN, RG_RESTART_COUNT and RG_NUM_THREADS/OMP_NUM_THREADS.\n"
      "Node 0 hosts the job's store; with --nnodes > 1 export the same RG_STORE_TOKEN on every\n"
      "node. Exit code: the first failing worker's (0 when all succeed), 128+N on signal N,\n"
      "127/126 when PROGRAM cannot be run, 2 for a bad command line.\n"
      "Before stopping the workers after a failure or a hang it asks them for their flight\n"
      "recorder dumps (SIGUSR1; RG_FLIGHT_RECORDER_DIR, default\n"
      "/tmp/ringgrad-flight/<launcher pid>/attempt<N>): ringgrad-bench flight DIR/rank*.json.");
  app.option_defaults()->always_capture_default();
  app.add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node, "workers on this node");
  app.add_option("--nnodes", o.nnodes, "number of nodes");
  app.add_option("--node-rank,--node_rank", o.node_rank, "this node's rank in [0, nnodes)");
  app.add_option("--master-addr,--master_addr", o.master_addr,
                 "host of node 0, where the job's store runs");
  app.add_option("--master-port,--master_port", o.master_port,
                 "port of the job's store (0: pick a free one; --nnodes 1 only)");
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "restart all workers up to this many times after a failure");
  app.add_option("--threads-per-worker", o.threads_per_worker,
                 "compute threads per worker (0: cores / nproc-per-node, at least 1)");
  app.add_option("--grace-period-s", o.grace_period_s,
                 "seconds between SIGTERM and SIGKILL when stopping workers");
  app.add_flag("--no-prefix", o.no_prefix, "do not prefix output lines with [rank N]");
  app.add_option("--heartbeat-timeout-s", o.heartbeat_timeout_s,
                 "a worker silent this long after its first heartbeat is stopped or hung: it is "
                 "killed and counts as failed (0: off)");
  app.add_option("--rdzv-timeout-s", o.rdzv_timeout_s,
                 "--nnodes > 1: how long a launcher waits for the others at each attempt");
  // Everything from PROGRAM on is the workers' command line, passed through untouched.
  app.prefix_command();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }
  o.command = app.remaining();
  if (!o.command.empty() && o.command[0] == "--") {
    o.command.erase(o.command.begin());
  } else if (!o.command.empty() && o.command[0].size() > 1 && o.command[0][0] == '-') {
    // prefix_command() stops at the first unknown argument, option or not.
    return usage_error(fmt::format("unknown option '{}'", o.command[0]));
  }
  if (const std::string problem = check_options(o); !problem.empty()) return usage_error(problem);

  std::string token;
  if (const char* t = std::getenv("RG_STORE_TOKEN"); t != nullptr && *t != '\0') {
    token = t;
  } else if (o.nnodes > 1) {
    return usage_error(
        "with --nnodes > 1 every node needs the same RG_STORE_TOKEN; e.g. export "
        "RG_STORE_TOKEN=$(openssl rand -hex 16) everywhere");
  } else {
    token = random_token();
  }

  // Signals are blocked before the store's thread starts (threads inherit the mask), so that
  // they all reach the signalfd and none kills the launcher behind the poll loop's back.
  sigset_t handled, original;
  sigemptyset(&handled);
  sigaddset(&handled, SIGCHLD);
  for (int sig : kForwardedSignals) sigaddset(&handled, sig);
  pthread_sigmask(SIG_BLOCK, &handled, &original);
  std::signal(SIGPIPE, SIG_IGN);
  const int signal_fd = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd < 0) {
    say(fmt::format("cannot create a signalfd: {}", errno_text(errno)));
    return kExitError;
  }

  std::unique_ptr<rg::dist::TcpStoreServer> store;
  uint16_t port = static_cast<uint16_t>(o.master_port);
  if (o.node_rank == 0) {
    try {
      rg::dist::TcpStoreServerOptions so;
      so.host = "0.0.0.0";
      so.port = port;
      so.token = token;
      store = std::make_unique<rg::dist::TcpStoreServer>(so);
      port = store->port();
    } catch (const std::exception& e) {
      say(fmt::format("cannot host the job's store on port {}: {}", o.master_port, e.what()));
      return kExitError;
    }
  }

  try {
    Launcher launcher(o, token, port, signal_fd, original);
    return launcher.run();
  } catch (const std::exception& e) {
    say(fmt::format("error: {}", e.what()));
    return kExitError;
  }
}
