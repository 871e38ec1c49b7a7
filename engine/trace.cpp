// The in-memory trace buffer and its Chrome JSON writer (nlohmann-json does the escaping).
#include "engine/trace.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "kernels/error.h"

namespace rg::trace {
namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {

struct Buffer {
  std::mutex mu;
  std::vector<Event> events;
  std::map<int, std::string> lanes{{0, "compute"}};
};

Buffer& buffer() {
  static Buffer b;
  return b;
}

int64_t to_us(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

void add(Event e) {
  Buffer& b = buffer();
  std::lock_guard lock(b.mu);
  b.events.push_back(std::move(e));
}

}  // namespace

namespace {
thread_local std::vector<std::string> t_scopes;
}  // namespace

NameScope::NameScope(std::string name) { t_scopes.push_back(std::move(name)); }
NameScope::~NameScope() { t_scopes.pop_back(); }
const std::string& current_scope() {
  static const std::string kNone;
  return t_scopes.empty() ? kNone : t_scopes.back();
}

void set_enabled(bool on) { detail::g_enabled.store(on, std::memory_order_relaxed); }

void name_lane(int lane, const std::string& name) {
  Buffer& b = buffer();
  std::lock_guard lock(b.mu);
  b.lanes[lane] = name;
}

void span(std::string name, std::string category, Clock::time_point start, Clock::time_point end,
          int lane, std::string args_json) {
  if (!enabled()) return;
  add({std::move(name), std::move(category), 'X', to_us(start),
       std::max<int64_t>(0, to_us(end) - to_us(start)), lane, std::move(args_json)});
}

void deferred_span(std::string name, std::string category, Clock::time_point start,
                   Clock::time_point end, int lane, std::string args_json) {
  add({std::move(name), std::move(category), 'X', to_us(start),
       std::max<int64_t>(0, to_us(end) - to_us(start)), lane, std::move(args_json)});
}

void instant(std::string name, std::string category, Clock::time_point at, int lane,
             std::string args_json) {
  if (!enabled()) return;
  add({std::move(name), std::move(category), 'i', to_us(at), 0, lane, std::move(args_json)});
}

namespace {
std::atomic<void (*)()> g_resolve_hook{nullptr};
}

void set_resolve_hook(void (*hook)()) { g_resolve_hook.store(hook); }

int lane_named(const std::string& name) {
  Buffer& b = buffer();
  std::lock_guard lock(b.mu);
  for (const auto& [lane, n] : b.lanes)
    if (n == name) return lane;
  const int lane = std::max(16, b.lanes.rbegin()->first + 1);
  b.lanes[lane] = name;
  return lane;
}

std::vector<Event> take_events() {
  if (auto hook = g_resolve_hook.load()) hook();
  Buffer& b = buffer();
  std::lock_guard lock(b.mu);
  std::vector<Event> out;
  out.swap(b.events);
  return out;
}

std::vector<std::pair<int, std::string>> lane_names() {
  Buffer& b = buffer();
  std::lock_guard lock(b.mu);
  return {b.lanes.begin(), b.lanes.end()};
}

std::string chrome_trace_json(const std::vector<std::vector<Event>>& per_process,
                              const std::vector<std::string>& process_names,
                              const std::vector<std::pair<int, std::string>>& lanes) {
  using nlohmann::json;
  json events = json::array();
  int64_t t0 = INT64_MAX;  // timestamps start at 0 for readability
  for (const auto& p : per_process)
    for (const auto& e : p) t0 = std::min(t0, e.ts_us);
  if (t0 == INT64_MAX) t0 = 0;
  for (size_t p = 0; p < per_process.size(); ++p) {
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", p},
                      {"tid", 0},
                      {"args", {{"name", process_names.at(p)}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", p},
                      {"tid", 0},
                      {"args", {{"sort_index", p}}}});
    for (const auto& [lane, name] : lanes)
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", p},
                        {"tid", lane},
                        {"args", {{"name", name}}}});
    for (const auto& e : per_process[p]) {
      json j = {{"name", e.name},     {"cat", e.category}, {"ph", std::string(1, e.phase)},
                {"ts", e.ts_us - t0}, {"pid", p},          {"tid", e.lane}};
      if (e.phase == 'X') j["dur"] = e.dur_us;
      if (e.phase == 'i') j["s"] = "t";
      if (!e.args_json.empty()) j["args"] = json::parse(e.args_json);
      events.push_back(std::move(j));
    }
  }
  return json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

std::string serialize(const std::vector<Event>& events) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& e : events)
    j.push_back(
        {e.name, e.category, std::string(1, e.phase), e.ts_us, e.dur_us, e.lane, e.args_json});
  return j.dump();
}

std::vector<Event> deserialize(const std::string& bytes) {
  std::vector<Event> out;
  const auto j = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  RG_CHECK(j.is_array(), "trace: malformed event list");
  for (const auto& e : j)
    out.push_back({e[0].get<std::string>(), e[1].get<std::string>(), e[2].get<std::string>().at(0),
                   e[3].get<int64_t>(), e[4].get<int64_t>(), e[5].get<int>(),
                   e[6].get<std::string>()});
  return out;
}

}  // namespace rg::trace
