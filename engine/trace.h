// Tracing for Chrome/Perfetto timelines: while enabled, code marks spans ("forward", each
// autograd node, each bucket's all-reduce) and instants ("bucket 3 ready"); the events are
// collected in memory per process and written as Chrome trace JSON (traceEvents, microseconds).
// Disabled (the default) every call is one relaxed atomic load.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace rg::trace {

using Clock = std::chrono::steady_clock;

struct Event {
  std::string name, category;
  char phase = 'X';   // 'X' complete span, 'i' instant
  int64_t ts_us = 0;  // steady clock, microseconds
  int64_t dur_us = 0;
  int lane = 0;           // Chrome "tid": lanes are named with name_lane()
  std::string args_json;  // "" or a JSON object
};

namespace detail {
extern std::atomic<bool> g_enabled;
}
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }
void set_enabled(bool on);

// Lanes group events into rows of the timeline (0 = "compute" by default).
void name_lane(int lane, const std::string& name);
void span(std::string name, std::string category, Clock::time_point start, Clock::time_point end,
          int lane = 0, std::string args_json = "");
// A span measured while tracing was on and resolved later (stream work): kept even if tracing
// has been turned off since.
void deferred_span(std::string name, std::string category, Clock::time_point start,
                   Clock::time_point end, int lane, std::string args_json = "");
void instant(std::string name, std::string category, Clock::time_point at, int lane = 0,
             std::string args_json = "");

// A span from construction to destruction (nothing is recorded while tracing is off).
class Scope {
 public:
  Scope(const char* name, const char* category, int lane = 0)
      : on_(enabled()), name_(name), category_(category), lane_(lane) {
    if (on_) start_ = Clock::now();
  }
  ~Scope() {
    if (on_) span(name_, category_, start_, Clock::now(), lane_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool on_;
  const char* name_;
  const char* category_;
  int lane_;
  Clock::time_point start_;
};

// The name of the code running now on this thread (a module's dotted path while its forward
// runs); autograd nodes created meanwhile remember it, so backward spans say which module they
// belong to. Scopes nest; "" when none is open.
class NameScope {
 public:
  explicit NameScope(std::string name);
  ~NameScope();
  NameScope(const NameScope&) = delete;
  NameScope& operator=(const NameScope&) = delete;
};
const std::string& current_scope();

// Takes the events recorded so far (and the lane names) out of the buffer. Spans whose times are
// known only later (work on CUDA streams, engine/cuda/stream_trace.h) are resolved first, by the
// hook that their recorder installs.
std::vector<Event> take_events();
void set_resolve_hook(void (*hook)());
// The lane called `name`, numbered on first use from 16 up (lanes of streams: "cuda:0 NCCL").
int lane_named(const std::string& name);
std::vector<std::pair<int, std::string>> lane_names();

// The events of several processes as one Chrome trace: process p is named `process_names[p]`.
std::string chrome_trace_json(const std::vector<std::vector<Event>>& per_process,
                              const std::vector<std::string>& process_names,
                              const std::vector<std::pair<int, std::string>>& lanes);
// One process's events as a compact string and back (for gathering them on rank 0).
std::string serialize(const std::vector<Event>& events);
std::vector<Event> deserialize(const std::string& bytes);

}  // namespace rg::trace
