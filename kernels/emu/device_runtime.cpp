// The emulated CUDA runtime: devices, memory, asynchronous streams (one worker thread each, or one
// for all in serialize mode), events with positions and times, the legacy default stream's
// implicit ordering, sticky errors, and the vector clocks that the race detector checks against.
#include "kernels/emu/device_runtime.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <thread>
#include <unordered_set>

#include "kernels/emu/device_properties.h"
#include "kernels/emu/racecheck.h"
#include "kernels/error.h"

using Clock = std::chrono::steady_clock;
using rg::emu::detail::Actor;
using rg::emu::detail::VectorClock;
using Name = std::shared_ptr<const std::string>;

// A name for the runtime's own operations, never destroyed: the allocators and the NCCL watchdog
// may free memory (and so call here) while static objects are destroyed at exit.
const Name& fixed_name(const char* text) {
  return *new Name(std::make_shared<const std::string>(text));
}

struct CUstream_st;

namespace {

struct Op {
  Name what;
  std::function<void()> work;
  std::vector<std::pair<CUstream_st*, uint64_t>> waits;  // (stream, position) to reach first
};

// One operation a stream capture recorded: what enqueue would have queued (its work, or what
// prepares its work at each launch).
struct GraphNode {
  Name what;
  std::vector<rg::emu::MemAccess> accesses;
  std::function<void()> work;
  rg::emu::Prepare prepare;
};

// A capture in progress (cudaStreamBeginCapture .. cudaStreamEndCapture): the stream that began
// it and the streams that joined it through captured events.
struct Capture {
  uint64_t id = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;                 // that began it
  std::vector<GraphNode> nodes;           // in the order the host queued them, from every member
  cudaError_t invalidated = cudaSuccess;  // why it can no longer make a graph
  CUstream_st* origin = nullptr;
  std::vector<CUstream_st*> members;  // the origin first
};

// Within a capture: the number of nodes each member stream had captured when this stream (or an
// event) was last ordered after it, itself included.
using CaptureFrontier = std::map<CUstream_st*, uint64_t>;

}  // namespace

struct CUgraph_st {
  int device = 0;
  std::vector<GraphNode> nodes;
};
struct CUgraphExec_st {
  int device = 0;
  std::vector<GraphNode> nodes;
};

struct CUstream_st {
  int device = 0;
  size_t index = 0;  // its slot in the vector clocks
  bool blocking = false;
  bool legacy = false;
  std::deque<Op> queue;  // the front is running or next
  uint64_t enqueued = 0, completed = 0;
  VectorClock clock;
  std::condition_variable work_cv;
  Name name;
  std::shared_ptr<Capture> capture;  // while capturing (or joined to a capture)
  uint64_t captured = 0;             // nodes it added to that capture
  CaptureFrontier frontier;          // what it is ordered after in it
};

struct CUevent_st {
  int device = 0;
  bool timing = true;
  CUstream_st* stream = nullptr;  // of the last record; nullptr: never recorded
  uint64_t position = 0;
  VectorClock clock;
  std::shared_ptr<std::optional<Clock::time_point>> reached_at;
  uint64_t captured_in = 0;        // the capture its last record was recorded in (0: none)
  std::weak_ptr<Capture> capture;  // that capture, and the recording stream's frontier then
  CaptureFrontier frontier;
};

namespace rg::emu {
namespace {

using ::rg::detail::cat;

long env_long(const char* name, long fallback, long lo, long hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  RG_CHECK(end != v && *end == '\0' && x >= lo && x <= hi, name, "=", v, " is not a number in [",
           lo, ", ", hi, "]");
  return x;
}

enum class RaceMode { off, warn, error };

RaceMode race_mode_from_env() {
  const char* v = std::getenv("RG_EMU_RACECHECK");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "error") == 0) return RaceMode::error;
  if (std::strcmp(v, "warn") == 0) return RaceMode::warn;
  if (std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0) return RaceMode::off;
  RG_FAIL("RG_EMU_RACECHECK=", v, " is not one of off, warn, error");
}

struct Allocation {
  size_t bytes;
  int owner;  // device, or -1 for pinned host memory
};

thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local cudaStreamCaptureMode t_capture_mode = cudaStreamCaptureModeGlobal;
thread_local uint64_t t_submissions = 0;  // host_submissions()

class Runtime {
 public:
  static Runtime& get() {
    // Never destroyed: stream workers may still run while the process exits.
    static Runtime* r = new Runtime();
    return *r;
  }

  const int devices = int(env_long("RG_EMU_DEVICES", 1, 0, 16));
  const bool serialize = env_long("RG_EMU_SERIALIZE", 0, 0, 1) == 1;
  const RaceMode race_mode = race_mode_from_env();
  bool launch_blocking = env_long("CUDA_LAUNCH_BLOCKING", 0, 0, 1) == 1;

  std::mutex mu;
  std::condition_variable done_cv;  // some stream completed an op

  bool valid_device(int d) const { return d >= 0 && d < devices; }

  // Resolves a handle (nullptr and the legacy/per-thread constants: the current device's legacy
  // stream); nullptr for an unknown handle. Under mu.
  CUstream_st* resolve(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) {
      if (!valid_device(t_device)) return nullptr;
      return legacy_stream(t_device);
    }
    return live_streams_.count(s) != 0 ? s : nullptr;
  }

  CUstream_st* legacy_stream(int device) {
    if (legacy_.empty()) legacy_.resize(size_t(devices), nullptr);
    CUstream_st*& s = legacy_[size_t(device)];
    if (s == nullptr) s = new_stream(device, /*blocking=*/true, /*legacy=*/true);
    return s;
  }

  CUstream_st* new_stream(int device, bool blocking, bool legacy) {
    auto* s = new CUstream_st;
    s->device = device;
    s->index = ++stream_count_;  // 0 is the host
    s->blocking = blocking;
    s->legacy = legacy;
    s->name = std::make_shared<const std::string>(
        legacy ? cat("cuda:", device, "/default") : cat("cuda:", device, "/stream ", s->index));
    live_streams_.insert(s);
    if (!legacy) device_streams_.emplace(device, s);
    if (!serialize) std::thread([this, s] { run_stream(s); }).detach();
    return s;
  }

  // The sticky error of a device, or "".
  std::string& sticky(int device) { return sticky_[size_t(device)]; }

  // Queues an op on s (under mu). `after` lists extra positions to wait for (stream waits).
  // Returns its position; throws on a sticky error or, in error mode, a race.
  // `prepare`: a capturing stream's node whose work is prepared at each launch.
  uint64_t enqueue_locked(CUstream_st* s, Name what, const std::vector<MemAccess>& accesses,
                          std::function<void()> work, const CUevent_st* after = nullptr,
                          Prepare prepare = nullptr) {
    if (const std::string& e = sticky(s->device); !e.empty()) {
      RG_FAIL("cuda:", s->device, ": ", *what, " was not run: an earlier operation failed: ", e);
    }
    throw_pending_reports();
    if (s->capture) {  // recorded, not run; nothing to order or check until a graph launch
      // As in CUDA, every later call into an invalidated capture fails (kernel launches, library
      // calls) until cudaStreamEndCapture ends it.
      // Thrown, not left as the last error: the emulated launch reports its own errors, and an
      // older error is taken as a GPU's failed launch replaces it and RG_LAUNCH's check takes it.
      if (const cudaError_t why = s->capture->invalidated; why != cudaSuccess) {
        t_last_error = cudaSuccess;
        RG_FAIL(
            "cuda:", s->device, ": ", *what, " on ", *s->name,
            " failed: operation failed due to a previous error during capture "
            "(cudaErrorStreamCaptureInvalidated; the capture was invalidated by an earlier call: ",
            cudaGetErrorString(why), ")");
      }
      s->capture->nodes.push_back({std::move(what), accesses, std::move(work), std::move(prepare)});
      ++s->captured;
      return 0;
    }
    RG_CHECK(!prepare, *what, ": prepared work outside a capture");
    if (s->legacy) {  // the legacy stream would join a capturing blocking stream's work
      for (CUstream_st* c : capturing_streams(s->device)) {
        if (!c->blocking) continue;
        c->capture->invalidated = cudaErrorStreamCaptureImplicit;
        RG_FAIL("cuda:", s->device, ": ", *what, " on the legacy default stream while ", *c->name,
                " is capturing (cudaErrorStreamCaptureImplicit; the capture is invalidated)");
      }
    }
    Op op{std::move(what), std::move(work), {}};
    if (after != nullptr && after->stream != nullptr) {
      op.waits.emplace_back(after->stream, after->position);
      s->clock.join(after->clock);
    }
    // The legacy default stream waits for every blocking stream of its device, and blocking
    // streams wait for it.
    if (s->legacy) {
      auto [b, e] = device_streams_.equal_range(s->device);
      for (auto it = b; it != e; ++it) {
        CUstream_st* o = it->second;
        if (!o->blocking) continue;
        if (o->enqueued > o->completed) op.waits.emplace_back(o, o->enqueued);
        s->clock.join(o->clock);
      }
    } else if (s->blocking) {
      CUstream_st* l = legacy_stream(s->device);
      if (l->enqueued > l->completed) op.waits.emplace_back(l, l->enqueued);
      s->clock.join(l->clock);
    }
    s->clock.join(host_clock_);
    const uint64_t epoch = s->clock.tick(s->index);
    if (race_mode != RaceMode::off && !accesses.empty()) {
      const Actor who{s->index, epoch, op.what, s->name};
      std::vector<std::string> reports;
      for (const MemAccess& a : accesses) {
        auto r = race_.access(a.ptr, a.bytes, a.write, who, s->clock);
        reports.insert(reports.end(), r.begin(), r.end());
      }
      if (!reports.empty()) report(std::move(reports), /*throw_now=*/true);
    }
    s->queue.push_back(std::move(op));
    const uint64_t position = ++s->enqueued;
    if (serialize) {
      serial_queue_.push_back(s);
      ensure_serial_worker();
      serial_cv_.notify_one();
    } else {
      s->work_cv.notify_one();
    }
    return position;
  }

  // Blocks the host until s has completed `position`; the host is then ordered after it.
  void wait_locked(std::unique_lock<std::mutex>& lock, CUstream_st* s, uint64_t position,
                   const VectorClock& clock) {
    done_cv.wait(lock, [&] { return s->completed >= position; });
    host_clock_.join(clock);
  }

  void synchronize_stream_locked(std::unique_lock<std::mutex>& lock, CUstream_st* s) {
    const VectorClock clock = s->clock;
    wait_locked(lock, s, s->enqueued, clock);
  }

  void synchronize_device_locked(std::unique_lock<std::mutex>& lock, int device) {
    synchronize_stream_locked(lock, legacy_stream(device));
    std::vector<CUstream_st*> streams;
    auto [b, e] = device_streams_.equal_range(device);
    for (auto it = b; it != e; ++it) streams.push_back(it->second);
    for (CUstream_st* s : streams) synchronize_stream_locked(lock, s);
  }

  void synchronize_all_locked(std::unique_lock<std::mutex>& lock) {
    for (int d = 0; d < devices; ++d) synchronize_device_locked(lock, d);
  }

  // The streams capturing now (of `device`, or of every device for -1).
  std::vector<CUstream_st*> capturing_streams(int device = -1) const {
    std::vector<CUstream_st*> out;
    for (cudaStream_t st : live_streams_) {
      if (st->capture && (device < 0 || st->device == device)) out.push_back(st);
    }
    return out;
  }
  // An unsafe call (cudaMalloc, cudaFree, device synchronization) invalidates the captures it
  // may disturb, as in CUDA: global-mode ones, and the calling thread's thread-local ones (all
  // but relaxed for `malloc_only` false). True if it did: the call then fails.
  bool refuse_during_capture(bool allowed_in_relaxed) {
    if (allowed_in_relaxed && t_capture_mode == cudaStreamCaptureModeRelaxed) return false;
    bool refused = false;
    for (CUstream_st* c : capturing_streams()) {
      const Capture& k = *c->capture;
      const bool hits =
          k.mode == cudaStreamCaptureModeGlobal ||
          (k.mode == cudaStreamCaptureModeThreadLocal && k.thread == std::this_thread::get_id()) ||
          (k.mode == cudaStreamCaptureModeRelaxed && !allowed_in_relaxed &&
           k.thread == std::this_thread::get_id());
      if (!hits) continue;
      c->capture->invalidated = cudaErrorStreamCaptureUnsupported;
      refused = true;
    }
    return refused;
  }
  // Ends a capture on every stream in it.
  static void end_capture_locked(const std::shared_ptr<Capture>& c) {
    for (CUstream_st* m : c->members) {
      m->capture.reset();
      m->captured = 0;
      m->frontier.clear();
    }
  }
  std::unordered_set<cudaGraph_t> live_graphs;
  std::unordered_set<cudaGraphExec_t> live_execs;
  uint64_t capture_count = 0;

  // Race reports: printed, kept for race_reports(), and in error mode thrown (now, or by the next
  // runtime call when they come from a context that cannot throw).
  void report(std::vector<std::string> reports, bool throw_now) {
    for (const std::string& r : reports) {
      std::fprintf(stderr, "ringgrad emulator: %s\n", r.c_str());
      all_reports_.push_back(r);
    }
    if (race_mode != RaceMode::error) return;
    std::string msg = reports.front();
    if (reports.size() > 1) msg += cat(" (and ", reports.size() - 1, " more)");
    if (throw_now) throw ::rg::Error(msg);
    pending_reports_.push_back(msg);
  }
  void throw_pending_reports() {
    if (pending_reports_.empty()) return;
    std::string msg = pending_reports_.front();
    pending_reports_.clear();
    throw ::rg::Error(msg);
  }

  VectorClock& host_clock() { return host_clock_; }
  detail::RaceChecker& race() { return race_; }
  std::vector<std::string>& all_reports() { return all_reports_; }

  // Memory registry.
  void add_memory(void* p, size_t bytes, int owner) {
    memory_[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, owner};
    race_.add_allocation(p, bytes,
                         owner >= 0 ? cat("cuda:", owner, " memory") : "pinned host memory");
  }
  std::optional<Allocation> remove_memory(void* p) {
    auto it = memory_.find(reinterpret_cast<uintptr_t>(p));
    if (it == memory_.end()) return std::nullopt;
    Allocation a = it->second;
    memory_.erase(it);
    race_.remove_allocation(p);
    return a;
  }
  int owner(const void* p) {
    const auto x = reinterpret_cast<uintptr_t>(p);
    auto it = memory_.upper_bound(x);
    if (it == memory_.begin()) return -2;
    --it;
    return x < it->first + std::max<size_t>(it->second.bytes, 1) ? it->second.owner : -2;
  }

  bool live_event(cudaEvent_t e) const { return live_events_.count(e) != 0; }
  void add_event(cudaEvent_t e) { live_events_.insert(e); }
  void remove_event(cudaEvent_t e) { live_events_.erase(e); }
  void remove_stream(CUstream_st* s) { live_streams_.erase(s); }

 private:
  Runtime() { sticky_.resize(size_t(devices)); }

  void run_op_unlocked(CUstream_st* s, Op& op, std::unique_lock<std::mutex>& lock) {
    done_cv.wait(lock, [&] {
      for (const auto& [o, p] : op.waits) {
        if (o->completed < p) return false;
      }
      return true;
    });
    std::function<void()> work = std::move(op.work);
    const Name what = op.what;
    lock.unlock();
    std::string error;
    std::exception_ptr exception;
    try {
      if (work) work();
    } catch (const std::exception& e) {
      error = e.what();
      exception = std::current_exception();
    } catch (...) {
      error = "unknown exception";
      exception = std::current_exception();
    }
    work = nullptr;  // releases what the work captured before the op counts as done
    lock.lock();
    if (!error.empty()) {
      last_failure_ = cat(*what, " on ", *s->name, ": ", error);
      last_exception_ = exception;
      if (!launch_blocking) {
        std::string& e = sticky_[size_t(s->device)];
        if (e.empty()) e = last_failure_;
      }
    }
    s->queue.pop_front();
    ++s->completed;
    done_cv.notify_all();
  }

  void run_stream(CUstream_st* s) {
    std::unique_lock lock(mu);
    for (;;) {
      s->work_cv.wait(lock, [&] { return !s->queue.empty(); });
      run_op_unlocked(s, s->queue.front(), lock);
    }
  }

  void ensure_serial_worker() {
    if (serial_started_) return;
    serial_started_ = true;
    std::thread([this] {
      std::unique_lock lock(mu);
      for (;;) {
        serial_cv_.wait(lock, [&] { return !serial_queue_.empty(); });
        CUstream_st* s = serial_queue_.front();
        serial_queue_.pop_front();
        run_op_unlocked(s, s->queue.front(), lock);
      }
    }).detach();
  }

 public:
  // The last failed op, for launch blocking's rethrow (of the original exception).
  std::string last_failure_;
  std::exception_ptr last_exception_;

 private:
  std::vector<CUstream_st*> legacy_;
  std::unordered_set<cudaStream_t> live_streams_;
  std::multimap<int, CUstream_st*> device_streams_;  // non-legacy streams by device
  std::unordered_set<cudaEvent_t> live_events_;
  size_t stream_count_ = 0;
  std::vector<std::string> sticky_;
  VectorClock host_clock_;
  detail::RaceChecker race_;
  std::vector<std::string> all_reports_, pending_reports_;
  std::map<uintptr_t, Allocation> memory_;
  std::deque<CUstream_st*> serial_queue_;
  std::condition_variable serial_cv_;
  bool serial_started_ = false;
};

cudaError_t fail(cudaError_t e) {
  t_last_error = e;
  return e;
}

// The status of a call on `device`: its sticky error first.
cudaError_t device_status(Runtime& r, int device) {
  if (!r.valid_device(device))
    return fail(r.devices == 0 ? cudaErrorNoDevice : cudaErrorInvalidDevice);
  if (!r.sticky(device).empty()) return fail(cudaErrorLaunchFailure);
  return cudaSuccess;
}

// The status of a call that queues work on s: its device's, then, as in CUDA, an error for every
// call into a capture that an earlier call invalidated (until cudaStreamEndCapture ends it).
cudaError_t stream_status(Runtime& r, const CUstream_st* s) {
  if (cudaError_t e = device_status(r, s->device); e != cudaSuccess) return e;
  if (s->capture && s->capture->invalidated != cudaSuccess)
    return fail(cudaErrorStreamCaptureInvalidated);
  return cudaSuccess;
}

void enqueue_and_maybe_wait(Runtime& r, std::unique_lock<std::mutex>& lock, CUstream_st* s,
                            Name what, const std::vector<MemAccess>& accesses,
                            std::function<void()> work, bool host_waits,
                            bool host_submission = true) {
  const uint64_t position = r.enqueue_locked(s, std::move(what), accesses, std::move(work));
  if (host_submission) ++t_submissions;  // (not a refused one)
  if ((host_waits || r.launch_blocking) && !s->capture) {
    const VectorClock clock = s->clock;
    r.last_exception_ = nullptr;
    r.wait_locked(lock, s, position, clock);
    if (r.launch_blocking && r.last_exception_) {
      std::rethrow_exception(std::exchange(r.last_exception_, nullptr));
    }
  }
}

bool is_pageable(Runtime& r, const void* p) { return r.owner(p) == -2; }

}  // namespace

void enqueue(cudaStream_t stream, std::string what, std::vector<MemAccess> accesses,
             std::function<void()> work) {
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  RG_CHECK(s != nullptr, what, ": invalid stream ", static_cast<void*>(stream),
           r.devices == 0 ? " (no emulated device: RG_EMU_DEVICES=0)" : "");
  enqueue_and_maybe_wait(r, lock, s, std::make_shared<const std::string>(std::move(what)), accesses,
                         std::move(work), false);
}

void enqueue_prepared(cudaStream_t stream, std::string what, std::vector<MemAccess> accesses,
                      const Prepare& prepare) {
  Runtime& r = Runtime::get();
  auto name = std::make_shared<const std::string>(std::move(what));
  {
    std::unique_lock lock(r.mu);
    CUstream_st* s = r.resolve(stream);
    RG_CHECK(s != nullptr, *name, ": invalid stream ", static_cast<void*>(stream));
    if (s->capture) {
      r.enqueue_locked(s, std::move(name), accesses, nullptr, nullptr, prepare);
      ++t_submissions;
      return;
    }
  }
  // Prepared without the runtime's lock (the preparation may take the library's own locks, which
  // are held around enqueue elsewhere).
  PreparedWork w = prepare();
  bool queued = false;  // an exception after it (launch blocking's rethrow) abandons nothing
  try {
    std::unique_lock lock(r.mu);
    CUstream_st* s = r.resolve(stream);
    RG_CHECK(s != nullptr && !s->capture, *name, ": the stream began a capture meanwhile");
    if (r.launch_blocking) r.last_exception_ = nullptr;
    const uint64_t position = r.enqueue_locked(s, std::move(name), accesses, std::move(w.run));
    queued = true;
    ++t_submissions;
    if (r.launch_blocking) {
      const VectorClock clock = s->clock;
      r.wait_locked(lock, s, position, clock);
      if (r.last_exception_) std::rethrow_exception(std::exchange(r.last_exception_, nullptr));
    }
  } catch (...) {
    if (!queued && w.abandon) w.abandon();
    throw;
  }
}

int stream_device(cudaStream_t stream) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  return s == nullptr ? t_device : s->device;
}

std::string stream_name(cudaStream_t stream) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  return s == nullptr ? "an invalid stream" : *s->name;
}

void set_launch_blocking(bool on) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  r.launch_blocking = on;
}
bool launch_blocking() { return Runtime::get().launch_blocking; }

bool stream_capturing(cudaStream_t stream) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  return s != nullptr && s->capture != nullptr;
}
bool serialize_mode() { return Runtime::get().serialize; }

int memory_owner(const void* ptr) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  return r.owner(ptr);
}

void annotate_block_allocated(int device, void* ptr, size_t bytes, cudaStream_t stream) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  if (r.race_mode == RaceMode::off || !r.valid_device(device)) return;
  const int saved = t_device;
  t_device = device;
  CUstream_st* s = r.resolve(stream);
  t_device = saved;
  if (s == nullptr) return;
  VectorClock at = r.host_clock();
  at.join(s->clock);
  const uint64_t epoch = s->clock.tick(s->index);
  at.join(s->clock);
  static const Name& what = fixed_name("the caching allocator");
  auto reports = r.race().block_handed_out(ptr, bytes, Actor{s->index, epoch, what, s->name}, at);
  if (!reports.empty()) r.report(std::move(reports), /*throw_now=*/false);
}

void annotate_block_freed(int device, void* ptr, size_t bytes, cudaStream_t stream,
                          const std::vector<cudaStream_t>& also_used_on) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  if (r.race_mode == RaceMode::off || !r.valid_device(device)) return;
  const int saved = t_device;
  t_device = device;
  CUstream_st* s = r.resolve(stream);
  std::vector<size_t> others;
  for (cudaStream_t o : also_used_on) {
    if (CUstream_st* os = r.resolve(o)) others.push_back(os->index);
  }
  t_device = saved;
  if (s == nullptr) return;
  VectorClock at = r.host_clock();
  at.join(s->clock);
  static const Name& what = fixed_name("free");
  auto reports = r.race().block_freed(
      ptr, bytes, Actor{s->index, s->clock.get(s->index), what, s->name}, at, others);
  if (!reports.empty()) r.report(std::move(reports), /*throw_now=*/false);
}

void annotate_host_block_allocated(void* ptr, size_t bytes) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  if (r.race_mode == RaceMode::off) return;
  static const Name& what = fixed_name("the pinned allocator");
  static const Name& host = fixed_name("the host");
  const uint64_t epoch = r.host_clock().tick(0);
  auto reports = r.race().block_handed_out(ptr, bytes, Actor{0, epoch, what, host}, r.host_clock());
  if (!reports.empty()) r.report(std::move(reports), /*throw_now=*/false);
}

void annotate_block_released(void* ptr, size_t bytes) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  if (r.race_mode == RaceMode::off) return;
  r.race().block_released(ptr, bytes);
}

cudaError_t query_event(cudaEvent_t event, bool orders_host) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  if (!r.live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  if (event->captured_in != 0) return fail(cudaErrorCapturedEvent);
  // As in CUDA, an unsafe call during a capture (PyTorch's allocator skips its event queries then).
  if (r.refuse_during_capture(false)) return fail(cudaErrorStreamCaptureUnsupported);
  if (event->stream == nullptr) return cudaSuccess;
  if (event->stream->completed < event->position) return cudaErrorNotReady;
  if (orders_host) r.host_clock().join(event->clock);
  return device_status(r, event->device);
}

cudaError_t poll_event(cudaEvent_t event) { return query_event(event, /*orders_host=*/false); }

void annotate_host_block_freed(void* ptr, size_t bytes,
                               const std::vector<std::pair<int, cudaStream_t>>& also_used_on) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  if (r.race_mode == RaceMode::off) return;
  std::vector<size_t> others;
  const int saved = t_device;
  for (const auto& [device, stream] : also_used_on) {
    if (!r.valid_device(device)) continue;
    t_device = device;
    if (CUstream_st* os = r.resolve(stream)) others.push_back(os->index);
  }
  t_device = saved;
  static const Name& what = fixed_name("free");
  static const Name& host = fixed_name("the host");
  auto reports = r.race().block_freed(ptr, bytes, Actor{0, r.host_clock().get(0), what, host},
                                      r.host_clock(), others);
  if (!reports.empty()) r.report(std::move(reports), /*throw_now=*/false);
}

std::vector<std::string> race_reports() {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  return r.all_reports();
}

void clear_race_reports() {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  r.all_reports().clear();
  try {
    r.throw_pending_reports();
  } catch (const ::rg::Error&) {  // dropped with the rest
  }
}

bool racecheck_enabled() { return Runtime::get().race_mode != RaceMode::off; }

std::string emulated_machine_id() {
  if (const char* id = std::getenv("RG_HOST_ID"); id != nullptr && *id != '\0') return id;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

cudaUUID_t device_uuid(int device) {
  // FNV-1a over the machine and the index, two seeds for 16 bytes, each through splitmix64's
  // finalizer (so that devices 0 and 1 do not look alike); shaped as a version 4 UUID.
  const std::string key = cat("ringgrad-emu/", emulated_machine_id(), "/", device);
  const auto fnv = [&key](uint64_t h) {
    for (unsigned char c : key) h = (h ^ c) * 0x100000001b3ull;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
  };
  const uint64_t words[2] = {fnv(0xcbf29ce484222325ull), fnv(0x84222325cbf29ce4ull)};
  cudaUUID_t u{};
  std::memcpy(u.bytes, words, sizeof(u.bytes));
  u.bytes[6] = char((u.bytes[6] & 0x0f) | 0x40);
  u.bytes[8] = char((u.bytes[8] & 0x3f) | 0x80);
  return u;
}

namespace {

thread_local uint64_t t_host_blocking_calls = 0;
thread_local int t_blocking_depth = 0;
std::atomic<HostBlockingObserver> host_blocking_observer{nullptr};

}  // namespace

// Marks one host-blocking call for its whole duration: counted, and shown to the observer, at the
// end of the outermost one on this thread. Declared before any lock, so the observer runs without
// the runtime's lock. `blocks` false: the call turned out not to wait (an asynchronous copy).
class HostBlocking {
 public:
  explicit HostBlocking(const char* call) : call_(call) { ++t_blocking_depth; }
  ~HostBlocking() {
    if (--t_blocking_depth > 0 || !blocks) return;
    ++t_host_blocking_calls;
    if (HostBlockingObserver o = host_blocking_observer.load(std::memory_order_acquire)) o(call_);
  }
  HostBlocking(const HostBlocking&) = delete;
  HostBlocking& operator=(const HostBlocking&) = delete;
  bool blocks = true;

 private:
  const char* call_;
};

uint64_t host_blocking_calls() { return t_host_blocking_calls; }
uint64_t host_submissions() { return t_submissions; }

bool refuse_during_capture(bool allowed_in_relaxed) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  return r.refuse_during_capture(allowed_in_relaxed);
}

void set_host_blocking_observer(HostBlockingObserver observer) {
  host_blocking_observer.store(observer, std::memory_order_release);
}

namespace {
std::atomic<LibraryObjectObserver> library_object_observer{nullptr};
}  // namespace

void set_library_object_observer(LibraryObjectObserver observer) {
  library_object_observer.store(observer, std::memory_order_release);
}
void library_object_created(const char* function) {
  if (LibraryObjectObserver o = library_object_observer.load(std::memory_order_acquire)) {
    o(function);
  }
}

void check_status(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  t_last_error = cudaSuccess;  // reported here, not by the next launch (kernels/cuda/check.h)
  std::string detail;
  if (status == cudaErrorLaunchFailure) {
    Runtime& r = Runtime::get();
    std::lock_guard lock(r.mu);
    for (int d = 0; d < r.devices; ++d) {
      if (!r.sticky(d).empty()) detail = cat(" (cuda:", d, ": ", r.sticky(d), ")");
    }
  }
  RG_FAIL(file, ":", line, ": ", call, " failed: ", cudaGetErrorString(status), detail);
}

}  // namespace rg::emu

// ---- The CUDA runtime API (kernels/emu/runtime_api.h) ----

using rg::emu::fail;
using rg::emu::HostBlocking;
using rg::emu::Runtime;
using rg::emu::t_capture_mode;
using rg::emu::t_device;
using rg::emu::t_last_error;

cudaError_t cudaGetLastError() { return std::exchange(t_last_error, cudaSuccess); }
cudaError_t cudaPeekAtLastError() { return t_last_error; }

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorCudartUnloading:
      return "driver shutting down";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorIllegalState:
      return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched:
      return "the capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined:
      return "the capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
  }
  return "unknown error";
}

cudaError_t cudaGetDeviceCount(int* count) {
  Runtime& r = Runtime::get();
  *count = r.devices;
  return r.devices == 0 ? fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  Runtime& r = Runtime::get();
  if (!r.valid_device(device)) {
    return fail(r.devices == 0 ? cudaErrorNoDevice : cudaErrorInvalidDevice);
  }
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!Runtime::get().valid_device(device)) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor:
      *value = 8;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
  }
  return fail(cudaErrorInvalidValue);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (!Runtime::get().valid_device(device)) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "ringgrad emulated device %d", device);
  prop->uuid = rg::emu::device_uuid(device);
  prop->totalGlobalMem = size_t(16) << 30;  // host memory, in fact; a plausible figure
  prop->major = 8;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  HostBlocking blocking("cudaDeviceSynchronize");
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  if (!r.valid_device(t_device)) return fail(cudaErrorNoDevice);
  if (r.refuse_during_capture(false)) {
    blocking.blocks = false;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  r.synchronize_device_locked(lock, t_device);
  return rg::emu::device_status(r, t_device);
}

cudaError_t cudaDeviceReset() {
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  if (!r.valid_device(t_device)) return fail(cudaErrorNoDevice);
  r.synchronize_device_locked(lock, t_device);
  r.sticky(t_device).clear();
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  Runtime& r = Runtime::get();
  if (cudaError_t e = rg::emu::device_status(r, t_device); e != cudaSuccess) return e;
  // 256-byte alignment, as cudaMalloc's.
  {
    std::lock_guard lock(r.mu);
    if (r.refuse_during_capture(true)) return fail(cudaErrorStreamCaptureUnsupported);
  }
  void* p = ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(256), std::nothrow);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  std::lock_guard lock(r.mu);
  r.add_memory(p, bytes, t_device);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  HostBlocking blocking("cudaFree");
  if (ptr == nullptr) return cudaSuccess;
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  if (r.refuse_during_capture(false)) {
    blocking.blocks = false;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  // As in CUDA, freeing waits for the device's work: nothing queued may still use the memory.
  r.synchronize_all_locked(lock);
  if (!r.remove_memory(ptr)) return fail(cudaErrorInvalidValue);
  ::operator delete(ptr, std::align_val_t(256));
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int) {
  Runtime& r = Runtime::get();
  if (r.devices == 0) return fail(cudaErrorNoDevice);
  {
    std::lock_guard lock(r.mu);  // an unsafe call during a capture, as cudaMalloc
    if (r.refuse_during_capture(true)) return fail(cudaErrorStreamCaptureUnsupported);
  }
  void* p = ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(4096), std::nothrow);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  std::lock_guard lock(r.mu);
  r.add_memory(p, bytes, -1);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, 0); }

cudaError_t cudaFreeHost(void* ptr) {
  HostBlocking blocking("cudaFreeHost");
  if (ptr == nullptr) return cudaSuccess;
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  if (r.refuse_during_capture(false)) {  // it waits for the device, as cudaFree
    blocking.blocks = false;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  r.synchronize_all_locked(lock);
  if (!r.remove_memory(ptr)) return fail(cudaErrorInvalidValue);
  ::operator delete(ptr, std::align_val_t(4096));
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t stream) {
  HostBlocking blocking("cudaMemcpyAsync (pageable host memory)");
  blocking.blocks = false;
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = rg::emu::stream_status(r, s); e != cudaSuccess) return e;
  if (bytes == 0) return cudaSuccess;
  const bool pageable = rg::emu::is_pageable(r, dst) || rg::emu::is_pageable(r, src);
  if (pageable && s->capture) {  // the host would wait: not capturable
    s->capture->invalidated = cudaErrorStreamCaptureUnsupported;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  blocking.blocks = pageable;
  auto what = std::make_shared<const std::string>(::rg::detail::cat(
      "cudaMemcpyAsync of ", bytes, " bytes", pageable ? " (pageable host memory)" : ""));
  rg::emu::enqueue_and_maybe_wait(
      r, lock, s, std::move(what), {{src, bytes, false}, {dst, bytes, true}},
      [=] { std::memmove(dst, src, bytes); }, pageable);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  HostBlocking blocking("cudaMemcpy");
  if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr); e != cudaSuccess) return e;
  return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = rg::emu::stream_status(r, s); e != cudaSuccess) return e;
  if (bytes == 0) return cudaSuccess;
  auto what = std::make_shared<const std::string>(
      ::rg::detail::cat("cudaMemsetAsync of ", bytes, " bytes"));
  rg::emu::enqueue_and_maybe_wait(
      r, lock, s, std::move(what), {{dst, bytes, true}}, [=] { std::memset(dst, value, bytes); },
      false);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  HostBlocking blocking("cudaMemset");
  if (cudaError_t e = cudaMemsetAsync(dst, value, bytes, nullptr); e != cudaSuccess) return e;
  return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  if (!r.valid_device(t_device)) return fail(cudaErrorNoDevice);
  *stream = r.new_stream(t_device, (flags & cudaStreamNonBlocking) == 0, /*legacy=*/false);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  if (s == nullptr || s->legacy) return fail(cudaErrorInvalidResourceHandle);
  // CUDA lets the queued work finish; the worker then idles forever. The stream stays in its
  // device's list (device synchronization, cudaFree and the legacy stream still wait for its
  // queued work) and is never freed, so events recorded on it stay valid.
  r.remove_stream(s);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = rg::emu::device_status(r, s->device); e != cudaSuccess) return e;
  if (s->capture) {
    s->capture->invalidated = cudaErrorStreamCaptureUnsupported;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  // Another stream: an unsafe call during a capture, as cudaEventQuery.
  if (r.refuse_during_capture(false)) return fail(cudaErrorStreamCaptureUnsupported);
  if (s->completed < s->enqueued) return cudaErrorNotReady;
  r.host_clock().join(s->clock);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  HostBlocking blocking("cudaStreamSynchronize");
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (s->capture) {
    blocking.blocks = false;
    s->capture->invalidated = cudaErrorStreamCaptureUnsupported;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  // Another stream: an unsafe call during a capture, as cudaDeviceSynchronize.
  if (r.refuse_during_capture(false)) {
    blocking.blocks = false;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  r.synchronize_stream_locked(lock, s);
  return rg::emu::device_status(r, s->device);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  if (s == nullptr || !r.live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = rg::emu::stream_status(r, s); e != cudaSuccess) return e;
  if (event->captured_in != 0) {
    // An event recorded in a capture: the waiting stream is ordered after the recording stream's
    // captured work so far, joining the capture when it is not in it yet (a fork).
    const std::shared_ptr<Capture> c = event->capture.lock();
    if (!c || c->id != event->captured_in) return fail(cudaErrorStreamCaptureIsolation);
    if (c->invalidated != cudaSuccess) return fail(cudaErrorStreamCaptureInvalidated);
    if (s->capture && s->capture != c) {  // two captures cannot depend on each other
      s->capture->invalidated = c->invalidated = cudaErrorStreamCaptureIsolation;
      return fail(cudaErrorStreamCaptureIsolation);
    }
    if (s->legacy) {  // the legacy stream cannot capture
      c->invalidated = cudaErrorStreamCaptureImplicit;
      return fail(cudaErrorStreamCaptureImplicit);
    }
    if (!s->capture) {
      s->capture = c;
      s->captured = 0;
      s->frontier.clear();
      c->members.push_back(s);
    }
    for (const auto& [m, n] : event->frontier) s->frontier[m] = std::max(s->frontier[m], n);
    return cudaSuccess;
  }
  if (s->capture) {
    // Recorded outside any capture: a dependency the graph cannot hold.
    if (event->stream == nullptr) return cudaSuccess;
    s->capture->invalidated = cudaErrorStreamCaptureIsolation;
    return fail(cudaErrorStreamCaptureIsolation);
  }
  if (event->stream == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  static const Name& what = fixed_name("cudaStreamWaitEvent");
  r.enqueue_locked(s, what, {}, nullptr, event);
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = rg::emu::stream_status(r, s); e != cudaSuccess) return e;
  static const Name& what = fixed_name("cudaLaunchHostFunc");
  rg::emu::enqueue_and_maybe_wait(
      r, lock, s, what, {}, [fn, user_data] { fn(user_data); }, false);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  if (!r.valid_device(t_device)) return fail(cudaErrorNoDevice);
  auto* e = new CUevent_st;
  e->device = t_device;
  e->timing = (flags & cudaEventDisableTiming) == 0;
  r.add_event(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  if (!r.live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  r.remove_event(event);
  delete event;  // a queued record keeps its own time slot
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  if (s == nullptr || !r.live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  if (s->device != event->device) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = rg::emu::stream_status(r, s); e != cudaSuccess) return e;
  if (s->capture) {  // a captured event: it orders work inside the capture only
    event->captured_in = s->capture->id;
    event->capture = s->capture;
    event->frontier = s->frontier;
    event->frontier[s] = s->captured;
    return cudaSuccess;
  }
  event->captured_in = 0;
  event->capture.reset();
  event->frontier.clear();
  auto reached = std::make_shared<std::optional<Clock::time_point>>();
  static const Name& what = fixed_name("cudaEventRecord");
  event->position = r.enqueue_locked(s, what, {}, [reached] { *reached = Clock::now(); });
  event->stream = s;
  event->clock = s->clock;
  event->reached_at = std::move(reached);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  return rg::emu::query_event(event, /*orders_host=*/true);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  HostBlocking blocking("cudaEventSynchronize");
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  if (!r.live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  if (event->captured_in != 0) {
    blocking.blocks = false;
    return fail(cudaErrorCapturedEvent);
  }
  // An unsafe call during a capture, as cudaEventQuery.
  if (r.refuse_during_capture(false)) {
    blocking.blocks = false;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (event->stream == nullptr) return cudaSuccess;
  const VectorClock clock = event->clock;
  r.wait_locked(lock, event->stream, event->position, clock);
  return rg::emu::device_status(r, event->device);
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  if (!r.live_event(start) || !r.live_event(end)) return fail(cudaErrorInvalidResourceHandle);
  if (start->captured_in != 0 || end->captured_in != 0) return fail(cudaErrorCapturedEvent);
  if (!start->timing || !end->timing || start->stream == nullptr || end->stream == nullptr) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  // Reached by position under the lock: the worker writes the time before it counts the op done.
  if (start->stream->completed < start->position || end->stream->completed < end->position) {
    return cudaErrorNotReady;
  }
  *ms = std::chrono::duration<float, std::milli>(**end->reached_at - **start->reached_at).count();
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = rg::emu::device_status(r, s->device); e != cudaSuccess) return e;
  if (s->legacy) return fail(cudaErrorStreamCaptureUnsupported);  // as CUDA: not the legacy one
  if (s->capture) return fail(cudaErrorIllegalState);
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return fail(cudaErrorInvalidValue);
  }
  s->capture = std::make_shared<Capture>();
  s->capture->id = ++r.capture_count;
  s->capture->mode = mode;
  s->capture->thread = std::this_thread::get_id();
  s->capture->origin = s;
  s->capture->members = {s};
  s->captured = 0;
  s->frontier.clear();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  if (s == nullptr || graph == nullptr) return fail(cudaErrorInvalidValue);
  if (!s->capture) return fail(cudaErrorIllegalState);
  const std::shared_ptr<Capture> capture = s->capture;
  *graph = nullptr;
  if (capture->origin != s) {  // a joined stream cannot end the capture; it is invalidated
    capture->invalidated = cudaErrorStreamCaptureUnmatched;
    return fail(cudaErrorStreamCaptureUnmatched);
  }
  if (capture->mode != cudaStreamCaptureModeRelaxed &&
      capture->thread != std::this_thread::get_id()) {
    return fail(cudaErrorStreamCaptureWrongThread);
  }
  // Every joined stream's captured work must be ordered before the end (joined back).
  bool unjoined = false;
  for (CUstream_st* m : capture->members) {
    auto it = s->frontier.find(m);
    if (m != s && m->captured > 0 && (it == s->frontier.end() || it->second < m->captured)) {
      unjoined = true;
    }
  }
  Runtime::end_capture_locked(capture);  // the capture ends on every member, whatever follows
  if (capture->invalidated != cudaSuccess) return fail(cudaErrorStreamCaptureInvalidated);
  if (unjoined) return fail(cudaErrorStreamCaptureUnjoined);
  auto* g = new CUgraph_st;
  g->device = s->device;
  g->nodes = std::move(capture->nodes);
  r.live_graphs.insert(g);
  *graph = g;
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr ||
      (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
       *mode != cudaStreamCaptureModeRelaxed))
    return fail(cudaErrorInvalidValue);
  std::swap(*mode, t_capture_mode);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  if (s == nullptr || status == nullptr) return fail(cudaErrorInvalidValue);
  *status = !s->capture                              ? cudaStreamCaptureStatusNone
            : s->capture->invalidated == cudaSuccess ? cudaStreamCaptureStatusActive
                                                     : cudaStreamCaptureStatusInvalidated;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  if (exec == nullptr || r.live_graphs.count(graph) == 0) return fail(cudaErrorInvalidValue);
  auto* x = new CUgraphExec_st;
  x->device = graph->device;
  x->nodes = graph->nodes;  // the graph may be destroyed; the executable keeps its own copy
  r.live_execs.insert(x);
  *exec = x;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  Runtime& r = Runtime::get();
  std::unique_lock lock(r.mu);
  CUstream_st* s = r.resolve(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (r.live_execs.count(exec) == 0) return fail(cudaErrorInvalidValue);
  if (cudaError_t e = rg::emu::stream_status(r, s); e != cudaSuccess) return e;
  if (s->device != exec->device) return fail(cudaErrorInvalidValue);
  if (s->capture) {  // a graph inside a capture: not emulated
    s->capture->invalidated = cudaErrorStreamCaptureUnsupported;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  ++rg::emu::t_submissions;  // the launch; its nodes are the graph's, not the host's
  // Prepared nodes get their work first, in node order, without the lock (see enqueue_prepared).
  const std::vector<GraphNode>& nodes = exec->nodes;
  std::vector<rg::emu::PreparedWork> prepared(nodes.size());
  size_t queued = 0;
  try {
    lock.unlock();
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].prepare) prepared[i] = nodes[i].prepare();
    lock.lock();
    RG_CHECK(r.live_execs.count(exec) != 0 && !s->capture,
             "cudaGraphLaunch: the graph was destroyed or the stream began a capture meanwhile");
    // (queued counts what is on the stream: a failure after that abandons nothing of it)
    uint64_t position = 0;
    if (r.launch_blocking) r.last_exception_ = nullptr;
    for (; queued < nodes.size(); ++queued) {
      const GraphNode& node = nodes[queued];
      position = r.enqueue_locked(s, node.what, node.accesses,
                                  node.prepare ? prepared[queued].run : node.work);
    }
    if (r.launch_blocking && position > 0) {  // the host waits for the whole graph
      const VectorClock clock = s->clock;
      r.wait_locked(lock, s, position, clock);
      if (r.last_exception_) std::rethrow_exception(std::exchange(r.last_exception_, nullptr));
    }
  } catch (...) {
    if (lock.owns_lock()) lock.unlock();
    for (size_t i = queued; i < nodes.size(); ++i)
      if (prepared[i].abandon) prepared[i].abandon();
    throw;
  }
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  if (r.live_execs.erase(exec) == 0) return fail(cudaErrorInvalidValue);
  delete exec;  // launches queued their own copies of the work
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Runtime& r = Runtime::get();
  std::lock_guard lock(r.mu);
  if (r.live_graphs.erase(graph) == 0) return fail(cudaErrorInvalidValue);
  delete graph;
  return cudaSuccess;
}
