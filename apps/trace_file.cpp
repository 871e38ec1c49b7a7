// The Chrome trace reader shared by ringgrad-bench's timeline, scale and profile subcommands.
#include "apps/trace_file.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/json_number.h"
#include "kernels/error.h"

namespace rg::apps {

using json = nlohmann::json;

namespace {

// A process (rank) or lane number: small and non-negative, so that 1 + pid counts processes.
constexpr int kMaxId = 1 << 24;

TraceEvent read_event(const json& e) {
  TraceEvent ev;
  ev.name = e.value("name", "");
  ev.cat = e.value("cat", "");
  const std::string ph = e.value("ph", "X");
  ev.ph = ph.empty() ? 'X' : ph[0];
  ev.ts = e.contains("ts") ? json_finite(e["ts"], "\"ts\"") : 0.0;
  ev.dur = e.contains("dur") ? json_finite(e["dur"], "\"dur\"") : 0.0;
  ev.pid = json_int_or<int>(e, "pid", 0, "\"pid\"", 0, kMaxId);
  ev.tid = json_int_or<int>(e, "tid", 0, "\"tid\"", -kMaxId, kMaxId);
  if (e.contains("args") && e["args"].is_object())
    for (const auto& [key, value] : e["args"].items())
      if (value.is_number() && std::isfinite(value.get<double>()))
        ev.args[key] = value.get<double>();
  return ev;
}

}  // namespace

const std::string& Trace::lane_name(const TraceEvent& e) const {
  static const std::string kNone;
  const auto it = lanes.find({e.pid, e.tid});
  return it == lanes.end() ? kNone : it->second;
}

bool Trace::on_stream(const TraceEvent& e) const {
  return e.ph == 'X' && lane_name(e).starts_with("cuda:");
}

std::vector<double> Trace::step_starts(int pid) const {
  // Host spans of category "step": forwards, and --cuda-graphs' replays and captures (a capture's
  // span starts its step, before the forward the capture runs inside it).
  auto host_step = [&](const TraceEvent& e, const char* name) {
    return e.pid == pid && e.ph == 'X' && e.cat == "step" && e.name == name && !on_stream(e);
  };
  std::vector<std::pair<double, double>> captures;
  for (const TraceEvent& e : events)
    if (host_step(e, "cuda graph capture")) captures.emplace_back(e.ts, e.ts + e.dur);
  std::vector<double> starts;
  for (const TraceEvent& e : events) {
    const bool in_capture = std::any_of(captures.begin(), captures.end(), [&](const auto& c) {
      return e.ts >= c.first && e.ts <= c.second;
    });
    if (host_step(e, "cuda graph replay") || host_step(e, "cuda graph capture") ||
        (host_step(e, "forward") && !in_capture))
      starts.push_back(e.ts);
  }
  std::sort(starts.begin(), starts.end());
  return starts;
}

Trace parse_trace(const std::string& text, const std::string& file) {
  const json j = json::parse(text, nullptr, false);
  RG_CHECK(!j.is_discarded(), file, " is not JSON (expected a ringgrad-train --trace file)");
  RG_CHECK(j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array(), file,
           " is not a Chrome trace (no \"traceEvents\")");
  Trace t;
  t.file = file;
  try {
    for (const auto& e : j["traceEvents"]) {
      RG_CHECK(e.is_object(), file, " is not a valid Chrome trace: an event is not an object");
      const int pid = json_int_or<int>(e, "pid", 0, "\"pid\"", 0, kMaxId);
      t.processes = std::max(t.processes, pid + 1);
      if (e.value("ph", "") == "M") {
        if (e.value("name", "") == "thread_name" && e.contains("args"))
          t.lanes[{pid, json_int_or<int>(e, "tid", 0, "\"tid\"", -kMaxId, kMaxId)}] =
              e["args"].value("name", "");
        continue;
      }
      t.events.push_back(read_event(e));
    }
  } catch (const json::exception& e) {
    RG_FAIL(file, " is not a valid Chrome trace: ", e.what());
  } catch (const Error& e) {
    RG_FAIL(file, " is not a valid Chrome trace: ", e.what());
  }
  return t;
}

Trace read_trace(const std::string& path) {
  std::ifstream f(path);
  RG_CHECK(f.good(), "cannot read ", path);
  std::stringstream s;
  s << f.rdbuf();
  return parse_trace(s.str(), path);
}

}  // namespace rg::apps
