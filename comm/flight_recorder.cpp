// The flight recorder's ring buffer, its JSON dump and the SIGUSR1 dump thread.
#include "comm/flight_recorder.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "kernels/error.h"

namespace rg::dist {
namespace {

constexpr size_t kDefaultCapacity = 2048;

size_t capacity_from_env() {
  const char* v = std::getenv("RG_FLIGHT_RECORDER_SIZE");
  if (v == nullptr || *v == '\0') return kDefaultCapacity;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  RG_CHECK(errno == 0 && *end == '\0' && n >= 0 && n <= (int64_t(1) << 24),
           "RG_FLIGHT_RECORDER_SIZE must be a number of calls in [0, 16777216] (0: off), got '", v,
           "'");
  return static_cast<size_t>(n);
}

std::string state_of(bool failed, double started_at, double ended_at) {
  if (failed) return "failed";
  if (ended_at >= 0) return "completed";
  if (started_at >= 0) return "started";
  return "enqueued";
}

nlohmann::ordered_json time_or_null(double unix_s) {
  return unix_s >= 0 ? nlohmann::ordered_json(unix_s) : nlohmann::ordered_json(nullptr);
}

std::string dump_dir() {
  if (const char* d = std::getenv("RG_FLIGHT_RECORDER_DIR"); d != nullptr && *d != '\0') return d;
  const char* port = std::getenv("MASTER_PORT");
  return "/tmp/ringgrad-flight/" + ((port != nullptr && *port != '\0')
                                        ? std::string(port)
                                        : std::to_string(static_cast<long>(::getpid())));
}

// Writes `bytes` to a temporary file next to `path` and renames it over `path`, so that a reader
// (the launcher polling for the dumps, the analyzer) never sees half a file. Returns "" or what
// went wrong.
std::string write_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot create " + tmp + ": " + std::strerror(errno);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return "cannot write " + tmp + ": " + why;
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return "cannot write " + path + ": " + why;
  }
  return "";
}

// The SIGUSR1 dump: the handler only writes a byte to this pipe (write is async-signal-safe);
// the thread reading it does the dump, which allocates and takes the recorder's lock.
int g_signal_pipe_write = -1;
std::atomic<int> g_signal_rank{0};
std::atomic<int> g_signal_world_size{1};

void on_sigusr1(int) {
  const int saved = errno;
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe_write, &byte, 1);
  errno = saved;
}

void signal_dump_loop(int read_fd) {
  char buf[64];
  while (true) {
    const ssize_t n = ::read(read_fd, buf, sizeof buf);  // several signals: one dump
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    const int rank = g_signal_rank.load();
    std::string line;
    try {
      const FlightRecorder& recorder = FlightRecorder::global();
      const std::string path = recorder.dump_to_file("signal", rank, g_signal_world_size.load());
      line = "ringgrad: flight recorder of rank " + std::to_string(rank) +
             (!path.empty()              ? " written to " + path
              : recorder.capacity() == 0 ? " is off (RG_FLIGHT_RECORDER_SIZE=0): nothing written"
                                         : " could not be written to " + dump_dir());
    } catch (const std::exception& e) {  // a bad RG_FLIGHT_RECORDER_SIZE: this thread must live on
      line = "ringgrad: flight recorder of rank " + std::to_string(rank) + ": " + e.what();
    }
    line += "\n";
    // One write, so that the line is not split by other threads' output.
    [[maybe_unused]] const ssize_t w = ::write(STDERR_FILENO, line.data(), line.size());
  }
}

}  // namespace

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

FlightRecorder& FlightRecorder::global() {
  // Never destroyed: the signal thread and error paths may dump during static destruction.
  static FlightRecorder* recorder = new FlightRecorder(capacity_from_env());
  return *recorder;
}

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(capacity), ring_(capacity) {}

uint64_t FlightRecorder::enqueued(const CollectiveCall& call) {
  if (capacity_ == 0) return 0;
  const double now = unix_seconds();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  Entry& e = ring_[(id - 1) % capacity_];
  // Assigning into the slot reuses its strings' and vectors' storage: no allocation once the ring
  // has gone round with calls of the same kind.
  e.id = id;
  e.call = call;
  e.enqueued_at = now;
  e.started_at = -1;
  e.ended_at = -1;
  e.error.clear();
  e.failed = false;
  return id;
}

void FlightRecorder::started(uint64_t id, double unix_s) {
  if (id == 0 || capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = ring_[(id - 1) % capacity_];
  if (e.id == id) e.started_at = unix_s;
}

void FlightRecorder::ended(uint64_t id, double unix_s, const std::string& error) {
  if (id == 0 || capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = ring_[(id - 1) % capacity_];
  if (e.id != id) return;
  e.ended_at = unix_s;
  e.failed = !error.empty();
  e.error = error;
}

std::string FlightRecorder::dump_json(const std::string& reason, int rank, int world_size) const {
  // A copy of the ring under the lock; the JSON is built after, so callers are not held up.
  std::vector<Entry> entries;
  uint64_t recorded = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    recorded = next_id_ - 1;
    const uint64_t first = recorded > capacity_ ? recorded - capacity_ + 1 : 1;
    entries.reserve(static_cast<size_t>(recorded - first + 1));
    for (uint64_t id = first; id <= recorded; ++id) {
      const Entry& e = ring_[(id - 1) % capacity_];
      if (e.id == id) entries.push_back(e);
    }
  }
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  nlohmann::ordered_json j;
  j["version"] = 1;
  j["rank"] = rank;
  j["world_size"] = world_size;
  j["pid"] = static_cast<int64_t>(::getpid());
  j["host"] = host;
  j["reason"] = reason;
  j["dumped_at"] = unix_seconds();
  j["capacity"] = capacity_;
  j["recorded"] = recorded;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const Entry& e : entries) {
    nlohmann::ordered_json x;
    x["id"] = e.id;
    x["group"] = e.call.group;
    x["seq"] = e.call.seq;
    x["op"] = e.call.op;
    x["reduce_op"] = e.call.reduce_op;
    x["root"] = e.call.root;
    x["tag"] = e.call.tag;
    x["dtype"] = e.call.dtype;
    x["shapes"] = e.call.shapes;
    x["device"] = e.call.device;
    x["state"] = state_of(e.failed, e.started_at, e.ended_at);
    x["enqueued_at"] = e.enqueued_at;
    x["started_at"] = time_or_null(e.started_at);
    x["ended_at"] = time_or_null(e.ended_at);
    if (e.failed) x["error"] = e.error;
    list.push_back(std::move(x));
  }
  j["entries"] = std::move(list);
  // Error texts are arbitrary bytes: invalid UTF-8 is replaced rather than failing the dump.
  return j.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

std::string FlightRecorder::dump_to_file(const std::string& reason, int rank,
                                         int world_size) const {
  if (capacity_ == 0) return "";
  try {
    const std::string dir = dump_dir();
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string path = dir + "/rank" + std::to_string(rank) + ".json";
    if (!write_atomically(path, dump_json(reason, rank, world_size)).empty()) return "";
    return path;
  } catch (...) {  // on an error path already: a failed dump must not replace the real error
    return "";
  }
}

void FlightRecorder::install_signal_dump(int rank, int world_size) {
  // A later init_process_group (another rank after an elastic restart) updates what is dumped.
  g_signal_rank = rank;
  g_signal_world_size = world_size;
  static std::once_flag once;
  std::call_once(once, [] {
    int fds[2];
    RG_CHECK(::pipe2(fds, O_CLOEXEC) == 0,
             "flight recorder: cannot create the SIGUSR1 pipe: ", std::strerror(errno));
    // Never blocks the handler: a full pipe already has a dump coming.
    ::fcntl(fds[1], F_SETFL, O_NONBLOCK);
    g_signal_pipe_write = fds[1];
    // Detached and blocked in read(): it does not keep the process alive, and the recorder it
    // uses is never destroyed.
    std::thread(signal_dump_loop, fds[0]).detach();
    struct sigaction sa {};
    sa.sa_handler = on_sigusr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    RG_CHECK(::sigaction(SIGUSR1, &sa, nullptr) == 0,
             "flight recorder: cannot install the SIGUSR1 handler: ", std::strerror(errno));
  });
}

}  // namespace rg::dist
