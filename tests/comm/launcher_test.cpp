// Tests of ringgrad-run, the launcher: runs the real binary on small `sh -c` programs and checks
// the workers' variables, the rank-prefixed output, exit codes, stopping, restarts and signals.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/processes.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

struct RunResult {
  int exit_code = -1;  // 128+N when the launcher died of signal N
  std::string out;
  std::string err;
  double seconds = 0;
  bool timed_out = false;
};

// The launcher as a child process with its stdout and stderr captured. Every wait is bounded:
// on a timeout the launcher gets SIGKILL (its workers follow through PR_SET_PDEATHSIG).
class Launcher {
 public:
  // Runs ringgrad-run with `args`; `env` entries ("NAME=value") are added to the environment
  // and RG_STORE_TOKEN is removed unless given there.
  explicit Launcher(const std::vector<std::string>& args, const std::vector<std::string>& env = {})
      : start_(Clock::now()) {
    // Built before fork(): the test process may have threads (thread pools of other tests).
    std::vector<std::string> argv_s = {RG_RUN_BINARY};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      if (entry.rfind("RG_STORE_TOKEN=", 0) != 0) env_s.push_back(entry);
    }
    env_s.insert(env_s.end(), env.begin(), env.end());
    std::vector<char*> argv, envp;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);

    int out[2], err[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(99);
    }
    EXPECT_GT(pid_, 0);
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }

  ~Launcher() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }

  // Reads output until stdout holds `needle` `count` times; false after `timeout_s`.
  bool wait_for_stdout(const std::string& needle, int count, double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (occurrences(result_.out, needle) < count) {
      if (Clock::now() >= deadline || !pump(10)) return false;
    }
    return true;
  }

  void signal(int sig) { ::kill(pid_, sig); }
  const std::string& stdout_so_far() const { return result_.out; }

  // Reads until the launcher has exited and closed its output.
  RunResult finish(double timeout_s = 20) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (out_fd_ >= 0 || err_fd_ >= 0 || !exited_) {
      if (Clock::now() >= deadline) {
        result_.timed_out = true;
        ::kill(pid_, SIGKILL);
        deadline_passed_ = true;
      }
      pump(deadline_passed_ ? 100 : 10);
      if (!exited_) {
        int status = 0;
        if (::waitpid(pid_, &status, deadline_passed_ ? 0 : WNOHANG) == pid_) {
          exited_ = true;
          result_.exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
        }
      }
      if (deadline_passed_ && exited_) break;
    }
    result_.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    return result_;
  }

 private:
  static int occurrences(const std::string& s, const std::string& needle) {
    int n = 0;
    for (size_t pos = s.find(needle); pos != std::string::npos; pos = s.find(needle, pos + 1)) ++n;
    return n;
  }

  // One poll over both pipes; false when both are closed.
  bool pump(int timeout_ms) {
    std::vector<pollfd> fds;
    if (out_fd_ >= 0) fds.push_back({out_fd_, POLLIN, 0});
    if (err_fd_ >= 0) fds.push_back({err_fd_, POLLIN, 0});
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
      return false;
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return true;
    for (const pollfd& p : fds) {
      if (p.revents == 0) continue;
      int& fd = p.fd == out_fd_ ? out_fd_ : err_fd_;
      std::string& sink = p.fd == out_fd_ ? result_.out : result_.err;
      char buf[4096];
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        sink.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fd);
        fd = -1;
      }
    }
    return true;
  }

  Clock::time_point start_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool exited_ = false;
  bool deadline_passed_ = false;
  RunResult result_;
};

RunResult run(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
              double timeout_s = 20) {
  return Launcher(args, env).finish(timeout_s);
}

using rg::testing::free_port;

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// "k1=v1 k2=v2" after the "[rank N] " prefix of each line, by rank.
std::map<int, std::map<std::string, std::string>> vars_by_rank(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> result;
  const std::regex line_re(R"(\[rank (\d+)\] (.*))");
  for (const std::string& line : lines(out)) {
    std::smatch m;
    if (!std::regex_match(line, m, line_re)) continue;
    std::istringstream words(m[2].str());
    for (std::string word; words >> word;) {
      const size_t eq = word.find('=');
      if (eq != std::string::npos) {
        result[std::stoi(m[1].str())][word.substr(0, eq)] = word.substr(eq + 1);
      }
    }
  }
  return result;
}

TEST(LauncherTest, PrefixesLinesAndSetsTheLaunchVariables) {
  const RunResult r =
      run({"--nproc-per-node", "3", "--master-port", "0", "--threads-per-worker", "2", "sh", "-c",
           "echo r=$RANK l=$LOCAL_RANK w=$WORLD_SIZE lw=$LOCAL_WORLD_SIZE "
           "g=$GROUP_RANK a=$MASTER_ADDR p=$MASTER_PORT t=$RG_STORE_TOKEN "
           "n=$RG_NUM_THREADS o=$OMP_NUM_THREADS rc=$RG_RESTART_COUNT "
           "te=$TORCHELASTIC_RESTART_COUNT ls=$RG_LAUNCHER_STORE"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(lines(r.out).size(), 3u) << r.out;
  const auto vars = vars_by_rank(r.out);
  ASSERT_EQ(vars.size(), 3u) << r.out;
  for (int rank = 0; rank < 3; ++rank) {
    const auto& v = vars.at(rank);
    EXPECT_EQ(v.at("r"), std::to_string(rank));
    EXPECT_EQ(v.at("l"), std::to_string(rank));
    EXPECT_EQ(v.at("w"), "3");
    EXPECT_EQ(v.at("lw"), "3");
    EXPECT_EQ(v.at("g"), "0");
    EXPECT_EQ(v.at("a"), "127.0.0.1");
    EXPECT_NE(v.at("p"), "0");
    EXPECT_GT(std::stoi(v.at("p")), 0);
    EXPECT_EQ(v.at("p"), vars.at(0).at("p"));
    EXPECT_TRUE(std::regex_match(v.at("t"), std::regex("[0-9a-f]{32}"))) << v.at("t");
    EXPECT_EQ(v.at("ls"), "1");  // the launcher hosts the store: rank 0 must not
    EXPECT_EQ(v.at("t"), vars.at(0).at("t"));
    EXPECT_EQ(v.at("n"), "2");
    EXPECT_EQ(v.at("o"), "2");
    EXPECT_EQ(v.at("rc"), "0");
    EXPECT_EQ(v.at("te"), "0");
  }
}

TEST(LauncherTest, DefaultThreadsSplitTheCores) {
  const RunResult r =
      run({"--nproc-per-node", "2", "--master-port", "0", "sh", "-c", "echo n=$RG_NUM_THREADS"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const int expected = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 2);
  const auto vars = vars_by_rank(r.out);
  ASSERT_EQ(vars.size(), 2u) << r.out;
  for (const auto& [rank, v] : vars) EXPECT_EQ(v.at("n"), std::to_string(expected));
}

TEST(LauncherTest, UsesTheTokenAndAddressItIsGiven) {
  const RunResult r = run({"--master-port", "0", "--master-addr", "localhost", "sh", "-c",
                           "echo t=$RG_STORE_TOKEN a=$MASTER_ADDR"},
                          {"RG_STORE_TOKEN=s3cret"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] t=s3cret a=localhost\n");
}

TEST(LauncherTest, OtherNodesGetTheirRanksAndHostNoStore) {
  // Node 1 of 2 hosts nothing: its workers use node 0's store, which node 0's launcher hosts
  // (the launchers also meet there at each attempt).
  const std::string port = std::to_string(free_port());
  const std::vector<std::string> cmd = {
      "sh", "-c",
      "echo r=$RANK l=$LOCAL_RANK w=$WORLD_SIZE lw=$LOCAL_WORLD_SIZE g=$GROUP_RANK a=$MASTER_ADDR "
      "p=$MASTER_PORT t=$RG_STORE_TOKEN"};
  std::vector<std::string> args0 = {"--nnodes",         "2", "--node-rank",   "0",
                                    "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                                    "--master-port",    port};
  std::vector<std::string> args1 = args0;
  args1[3] = "1";
  args0.insert(args0.end(), cmd.begin(), cmd.end());
  args1.insert(args1.end(), cmd.begin(), cmd.end());
  Launcher node0(args0, {"RG_STORE_TOKEN=shared"});
  const RunResult r = run(args1, {"RG_STORE_TOKEN=shared"});
  EXPECT_EQ(node0.finish().exit_code, 0);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const auto vars = vars_by_rank(r.out);
  ASSERT_EQ(vars.size(), 2u) << r.out;
  for (int local = 0; local < 2; ++local) {
    const auto& v = vars.at(2 + local);
    EXPECT_EQ(v.at("r"), std::to_string(2 + local));
    EXPECT_EQ(v.at("l"), std::to_string(local));
    EXPECT_EQ(v.at("w"), "4");
    EXPECT_EQ(v.at("lw"), "2");
    EXPECT_EQ(v.at("g"), "1");
    EXPECT_EQ(v.at("a"), "127.0.0.1");
    EXPECT_EQ(v.at("p"), port);
    EXPECT_EQ(v.at("t"), "shared");
  }
}

TEST(LauncherTest, SeveralNodesNeedAToken) {
  const RunResult r =
      run({"--nnodes", "2", "--node-rank", "1", "--master-port", "29999", "sh", "-c", "true"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("RG_STORE_TOKEN"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(LauncherTest, StderrStaysOnStderr) {
  const RunResult r = run({"--master-port", "0", "sh", "-c", "echo to-out; echo to-err >&2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] to-out\n");
  EXPECT_EQ(r.err, "[rank 0] to-err\n");
}

TEST(LauncherTest, PartialLastLineIsPrinted) {
  const RunResult r = run({"--master-port", "0", "sh", "-c", "printf 'one\\ntwo'; printf x >&2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] one\n[rank 0] two\n");
  EXPECT_EQ(r.err, "[rank 0] x\n");
}

TEST(LauncherTest, LinesOfDifferentRanksNeverMix) {
  // Each line is written in three pieces, so the launcher sees partial lines all the time.
  const RunResult r = run({"--nproc-per-node", "4", "--master-port", "0", "sh", "-c",
                           "i=0; while [ $i -lt 200 ]; do printf \"r$RANK-\"; printf \"$i\"; "
                           "printf '\\n'; i=$((i+1)); done"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::regex line_re(R"(\[rank (\d)\] r(\d)-(\d+))");
  std::map<int, int> next;  // each rank's lines arrive in order
  const auto all = lines(r.out);
  EXPECT_EQ(all.size(), 800u);
  for (const std::string& line : all) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << line;
    EXPECT_EQ(m[1].str(), m[2].str()) << line;
    const int rank = std::stoi(m[1].str());
    EXPECT_EQ(std::stoi(m[3].str()), next[rank]++) << line;
  }
}

TEST(LauncherTest, NoPrefix) {
  const RunResult r = run({"--no-prefix", "--master-port", "0", "sh", "-c", "echo plain"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "plain\n");
}

TEST(LauncherTest, ProgramArgumentsPassThroughUntouched) {
  const RunResult r = run({"--master-port", "0", "sh", "-c", "echo \"$@\"", "sh",
                           "--nproc-per-node", "5", "-x", "--", "--bogus"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] --nproc-per-node 5 -x -- --bogus\n");
  const RunResult dashdash = run({"--master-port", "0", "--", "sh", "-c", "echo hi"});
  EXPECT_EQ(dashdash.exit_code, 0) << dashdash.err;
  EXPECT_EQ(dashdash.out, "[rank 0] hi\n");
}

TEST(LauncherTest, WorkersThatSucceedEarlyAreWaitedFor) {
  const RunResult r = run({"--nproc-per-node", "2", "--master-port", "0", "sh", "-c",
                           "if [ $RANK = 1 ]; then sleep 0.5; echo late; fi"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 1] late\n");
  EXPECT_EQ(r.err, "");
}

TEST(LauncherTest, FirstFailureStopsTheOthersAndGivesItsExitCode) {
  const RunResult r = run({"--nproc-per-node", "4", "--master-port", "0", "sh", "-c",
                           "if [ $RANK = 1 ]; then echo bye >&2; exit 3; fi; sleep 30"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_LT(r.seconds, 4.0);  // the sleepers got SIGTERM, not the 5 s grace period
  EXPECT_NE(r.err.find("[rank 1] bye\n"), std::string::npos) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(ringgrad-run: rank 1 \(pid \d+\) exited with code 3; stopping the )"
                        R"(other 3 workers\n)")))
      << r.err;
  // The stopped workers' exits are not reported as failures.
  EXPECT_EQ(lines(r.err).size(), 2u) << r.err;
}

TEST(LauncherTest, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  // Rank 0 fails only once rank 1 ignores SIGTERM (a marker file says so).
  char dir_template[] = "/tmp/rg_launcher_test_XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string marker = std::string(dir_template) + "/ignoring";
  const RunResult r =
      run({"--nproc-per-node", "2", "--master-port", "0", "--grace-period-s", "0.5", "sh", "-c",
           "if [ $RANK = 0 ]; then until [ -e \"$0\" ]; do sleep 0.01; done; "
           "exit 5; fi; trap '' TERM; touch \"$0\"; sleep 30",
           marker});
  ::unlink(marker.c_str());
  ::rmdir(dir_template);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 5);
  EXPECT_GE(r.seconds, 0.5);
  EXPECT_LT(r.seconds, 4.0);
  EXPECT_NE(r.err.find("stopping the other worker\n"), std::string::npos) << r.err;
}

TEST(LauncherTest, WorkerKilledBySignalGives128PlusSignal) {
  const RunResult r = run({"--master-port", "0", "sh", "-c", "kill -KILL $$"});
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(rank 0 \(pid \d+\) was killed by SIGKILL \(exit code 137\)\n)")))
      << r.err;
}

TEST(LauncherTest, RestartsAllWorkersWithTheNextRestartCount) {
  const RunResult r =
      run({"--nproc-per-node", "2", "--master-port", "0", "--max-restarts", "1", "sh", "-c",
           "echo rc=$RG_RESTART_COUNT te=$TORCHELASTIC_RESTART_COUNT "
           "p=$MASTER_PORT t=$RG_STORE_TOKEN; "
           "if [ $RANK = 1 ] && [ $RG_RESTART_COUNT = 0 ]; then exit 7; fi"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Rank 0's first line may never come: rank 1 can fail (and rank 0 be stopped) before it.
  for (const char* line : {"[rank 1] rc=0 te=0 ", "[rank 0] rc=1 te=1 ", "[rank 1] rc=1 te=1 "}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " in\n" << r.out;
  }
  EXPECT_NE(r.err.find("exited with code 7"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ringgrad-run: restarting the workers (restart 1 of 1)\n"),
            std::string::npos)
      << r.err;
  // The store outlives the attempts: same port and token in both.
  std::set<std::string> ports, tokens;
  const std::regex re(R"(p=(\d+) t=(\w+))");
  for (const std::string& line : lines(r.out)) {
    std::smatch m;
    if (std::regex_search(line, m, re)) {
      ports.insert(m[1].str());
      tokens.insert(m[2].str());
    }
  }
  EXPECT_EQ(ports.size(), 1u) << r.out;
  EXPECT_EQ(tokens.size(), 1u) << r.out;
}

// Two launchers as two nodes (torchrun's agents): a worker failing on node 1 stops node 0's
// workers too, and both launchers restart all their workers with the next restart count.
TEST(LauncherTest, TwoNodesRestartAllWorkersOfBothNodes) {
  const std::string port = std::to_string(free_port());
  const std::string cmd =
      "if [ $RANK = 2 ] && [ $RG_RESTART_COUNT = 0 ]; then sleep 0.3; exit 7; fi; "
      "if [ $RG_RESTART_COUNT = 0 ]; then sleep 30; fi; echo ok rank=$RANK rc=$RG_RESTART_COUNT";
  const auto node = [&](int rank) {
    return std::vector<std::string>{"--nnodes",
                                    "2",
                                    "--node-rank",
                                    std::to_string(rank),
                                    "--nproc-per-node",
                                    "2",
                                    "--master-port",
                                    port,
                                    "--max-restarts",
                                    "1",
                                    "--rdzv-timeout-s",
                                    "30",
                                    "sh",
                                    "-c",
                                    cmd};
  };
  Launcher node0(node(0), {"RG_STORE_TOKEN=two-nodes"});
  Launcher node1(node(1), {"RG_STORE_TOKEN=two-nodes"});
  const RunResult r1 = node1.finish(40), r0 = node0.finish(40);
  ASSERT_FALSE(r0.timed_out || r1.timed_out) << r0.err << r1.err;
  EXPECT_EQ(r0.exit_code, 0) << r0.err;
  EXPECT_EQ(r1.exit_code, 0) << r1.err;
  EXPECT_NE(r1.err.find("rank 2 (pid "), std::string::npos) << r1.err;
  EXPECT_NE(r0.err.find("another node failed (rank 2 on node 1 exited with code 7)"),
            std::string::npos)
      << r0.err;
  for (const char* line : {"[rank 0] ok rank=0 rc=1", "[rank 1] ok rank=1 rc=1"})
    EXPECT_NE(r0.out.find(line), std::string::npos) << r0.out;
  for (const char* line : {"[rank 2] ok rank=2 rc=1", "[rank 3] ok rank=3 rc=1"})
    EXPECT_NE(r1.out.find(line), std::string::npos) << r1.out;
  EXPECT_LT(r0.seconds, 20) << "node 0's sleeping workers were stopped, not waited for";
}

// A worker that sends heartbeats (as rg_comm does, through RG_HEARTBEAT_FD) and is then stopped
// with SIGSTOP is detected by its silence, killed, and the job restarts.
TEST(LauncherTest, AStoppedWorkerIsDetectedByItsHeartbeat) {
  Launcher l({"--nproc-per-node", "2", "--master-port", "0", "--heartbeat-timeout-s", "1",
              "--max-restarts", "1", "sh", "-c",
              "echo pid=$$; if [ $RG_RESTART_COUNT = 1 ]; then echo done; exit 0; fi; "
              "while true; do printf x >&$RG_HEARTBEAT_FD; sleep 0.2; done"});
  ASSERT_TRUE(l.wait_for_stdout("pid=", 2, 10)) << l.stdout_so_far();
  std::smatch m;
  const std::string so_far = l.stdout_so_far();
  const std::regex re(R"(\[rank 1\] pid=(\d+))");
  ASSERT_TRUE(std::regex_search(so_far, m, re)) << so_far;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // it has beaten by now
  ::kill(std::stoi(m[1].str()), SIGSTOP);
  const RunResult r = l.finish(20);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("rank 1 (pid " + m[1].str() + ") sent no heartbeat for"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("(stopped or hung); killing it"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restarting the workers (restart 1 of 1)"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("[rank 1] done"), std::string::npos) << r.out;
}

// A worker that "has a flight recorder": it beats, and on SIGUSR1 writes its dump file (as
// comm/flight_recorder.h does, by rename) into RG_FLIGHT_RECORDER_DIR. The shell runs the trap
// between its short sleeps; it says so first, since it is stopped as soon as the file is there.
const std::string kDumpingWorker =
    "trap 'echo dumped; mkdir -p \"$RG_FLIGHT_RECORDER_DIR\"; "
    "f=\"$RG_FLIGHT_RECORDER_DIR/rank$RANK.json\"; echo dump > \"$f.tmp\"; mv \"$f.tmp\" \"$f\"' "
    "USR1; ";

// When a worker fails, the others are asked for their flight recorder dumps before they are
// stopped; the launcher waits only until they are written and says where they are.
TEST(LauncherTest, AFailureRequestsFlightRecorderDumpsFirst) {
  const RunResult r =
      run({"--nproc-per-node", "3", "--master-port", "0", "sh", "-c",
           kDumpingWorker + "printf x >&$RG_HEARTBEAT_FD; echo dir=$RG_FLIGHT_RECORDER_DIR; "
                            "if [ $RANK = 1 ]; then sleep 0.5; exit 3; fi; "
                            "while true; do printf x >&$RG_HEARTBEAT_FD; sleep 0.05; done"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_LT(r.seconds, 2.4) << "the launcher waited for dumps that had been written";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\[rank 0\] dir=(\S+))"))) << r.out;
  const std::string dir = m[1].str();
  EXPECT_TRUE(std::regex_match(dir, std::regex(R"(/tmp/ringgrad-flight/\d+/attempt0)"))) << dir;
  EXPECT_NE(r.out.find("[rank 0] dumped\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 2] dumped\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[rank 1] dumped\n"), std::string::npos) << "the failed rank is gone";
  EXPECT_NE(r.err.find("ringgrad-run: flight recorder dumps in " + dir +
                       "; analyze with: ringgrad-bench flight " + dir + "/rank*.json\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("no flight recorder dump"), std::string::npos) << r.err;
  EXPECT_TRUE(std::ifstream(dir + "/rank0.json").good());
  EXPECT_TRUE(std::ifstream(dir + "/rank2.json").good());
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
}

// A hung worker (SIGSTOP: it cannot dump) is detected by its heartbeat; the other one dumps into
// the user's RG_FLIGHT_RECORDER_DIR, and the wait for the stopped one is bounded.
TEST(LauncherTest, AHangRequestsDumpsAndTheWaitIsBounded) {
  char dir_template[] = "/tmp/rg_launcher_flight_XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const RunResult r = run(
      {"--nproc-per-node", "2", "--master-port", "0", "--heartbeat-timeout-s", "0.5", "sh", "-c",
       kDumpingWorker + "printf x >&$RG_HEARTBEAT_FD; echo dir=$RG_FLIGHT_RECORDER_DIR; "
                        "if [ $RANK = 1 ]; then sleep 0.2; kill -STOP $$; fi; "
                        "while true; do printf x >&$RG_HEARTBEAT_FD; sleep 0.05; done"},
      {"RG_FLIGHT_RECORDER_DIR=" + dir});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.out.find("[rank 0] dir=" + dir + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("rank 1 (pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ringgrad-run: no flight recorder dump from rank 1 within 2 s"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("ringgrad-run: flight recorder dumps in " + dir + "; analyze with"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(std::ifstream(dir + "/rank0.json").good());
  EXPECT_FALSE(std::ifstream(dir + "/rank1.json").good());
  EXPECT_GE(r.seconds, 2.5);  // 0.5 s of silence, then the whole 2 s wait for rank 1
  EXPECT_LT(r.seconds, 10.0);
  std::filesystem::remove_all(dir);
}

// The same with the real flight recorder (tests/comm/flight_worker.cpp): rank 1 fails, rank 0's
// SIGUSR1 dump shows it inside its 13th all-reduce.
TEST(LauncherTest, RealFlightRecorderDumpsOnRequest) {
  char dir_template[] = "/tmp/rg_launcher_flight_XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const RunResult r = run({"--nproc-per-node", "2", "--master-port", "0", RG_FLIGHT_WORKER},
                          {"RG_FLIGHT_RECORDER_DIR=" + dir});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("[rank 0] ringgrad: flight recorder of rank 0 written to " + dir +
                       "/rank0.json\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("flight recorder dumps in " + dir), std::string::npos) << r.err;
  std::ifstream in(dir + "/rank0.json");
  const auto dump = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(dump.is_object()) << "rank0.json is not JSON";
  EXPECT_EQ(dump["reason"], "signal");
  EXPECT_EQ(dump["world_size"], 2);
  ASSERT_EQ(dump["entries"].size(), 13u);
  EXPECT_EQ(dump["entries"][12]["seq"], 13);
  EXPECT_EQ(dump["entries"][12]["state"], "started");
  EXPECT_EQ(dump["entries"][11]["state"], "completed");
  std::filesystem::remove_all(dir);
}

TEST(LauncherTest, RestartsRunOutThenTheFailureCodeIsReturned) {
  const RunResult r = run({"--master-port", "0", "--max-restarts", "2", "sh", "-c",
                           "echo attempt $RG_RESTART_COUNT; exit 4"});
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_EQ(r.out, "[rank 0] attempt 0\n[rank 0] attempt 1\n[rank 0] attempt 2\n");
  EXPECT_NE(r.err.find("restart 2 of 2"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restart 3"), std::string::npos) << r.err;
}

void expect_signal_forwarded(int sig, const std::string& trap_name) {
  Launcher launcher({"--nproc-per-node", "2", "--master-port", "0", "sh", "-c",
                     "trap 'echo got-" + trap_name + "; exit 0' " + trap_name +
                         "; echo ready; while :; do sleep 0.05; done"});
  ASSERT_TRUE(launcher.wait_for_stdout("ready", 2, 20));
  launcher.signal(sig);
  const RunResult r = launcher.finish();
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + sig) << r.err;
  EXPECT_NE(r.out.find("[rank 0] got-" + trap_name + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 1] got-" + trap_name + "\n"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 5.0);
}

TEST(LauncherTest, SigtermIsForwardedToTheWorkers) { expect_signal_forwarded(SIGTERM, "TERM"); }

TEST(LauncherTest, SigintIsForwardedToTheWorkers) { expect_signal_forwarded(SIGINT, "INT"); }

TEST(LauncherTest, ProgramNotFound) {
  const RunResult r = run({"--nproc-per-node", "2", "--master-port", "0", "no-such-program-rg"});
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_EQ(r.err, "ringgrad-run: cannot run 'no-such-program-rg': No such file or directory\n");
  EXPECT_EQ(r.out, "");
}

TEST(LauncherTest, ProgramNotExecutable) {
  const RunResult r = run({"--master-port", "0", "/"});
  EXPECT_EQ(r.exit_code, 126);
  EXPECT_NE(r.err.find("ringgrad-run: cannot run '/': "), std::string::npos) << r.err;
}

TEST(LauncherTest, BadCommandLinesExitWithCode2AndOneLine) {
  const std::vector<std::vector<std::string>> bad = {
      {"--bogus", "sh"},
      {"--nproc-per-node", "x", "sh"},
      {"--nproc-per-node", "0", "sh"},
      {"--nnodes", "2", "--node-rank", "2", "sh"},
      {"--master-port", "70000", "sh"},
      {"--nnodes", "2", "--master-port", "0", "sh"},
      {"--max-restarts", "-1", "sh"},
      {"--grace-period-s", "-1", "sh"},
      {"--nproc-per-node", "2"},
      {},
  };
  for (const auto& args : bad) {
    const RunResult r = run(args);
    std::string cmd;
    for (const auto& a : args) cmd += a + " ";
    EXPECT_EQ(r.exit_code, 2) << cmd << r.err;
    EXPECT_EQ(lines(r.err).size(), 1u) << cmd << r.err;
    EXPECT_EQ(r.err.rfind("ringgrad-run: ", 0), 0u) << cmd << r.err;
    EXPECT_EQ(r.out, "") << cmd;
  }
  const RunResult r = run({"--heartbeat-timeout-s", "-1", "sh"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--heartbeat-timeout-s must be >= 0"), std::string::npos) << r.err;
  const RunResult not_int = run({"--nproc-per-node", "x", "sh"});
  EXPECT_NE(not_int.err.find("--nproc-per-node"), std::string::npos) << not_int.err;
}

TEST(LauncherTest, PortInUseIsOneLineNamingThePort) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  const RunResult r = run({"--master-port", port, "sh", "-c", "echo should-not-run"});
  ::close(fd);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(lines(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find(port), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

}  // namespace
