// ringgrad-bench flight FILES...: reads every rank's flight recorder dump (comm/flight_recorder.h)
// and says in plain words what happened in each process group: the first sequence number where
// the ranks' calls disagree, the ranks that never reached the last call another rank made, the
// ranks stuck in a call and since when, the calls that failed, the ranks with no dump at all, and
// which calls the comparison covers when the rings dropped older calls.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/collective_call.h"

namespace rg::apps {

struct FlightEntry {
  uint64_t id = 0;
  dist::CollectiveCall call;
  std::string state;  // "enqueued", "started", "completed" or "failed"
  double enqueued_at = 0;
  std::optional<double> started_at, ended_at;
  std::string error;
};

struct FlightDump {
  std::string file;  // where it was read from, for messages
  int rank = 0;
  int world_size = 1;
  int64_t pid = 0;
  std::string host, reason;
  double dumped_at = 0;
  uint64_t capacity = 0, recorded = 0;
  std::vector<FlightEntry> entries;  // oldest first
};

// Parses one dump; throws rg::Error naming `file` when the text is not JSON, not a dump, or of
// another version.
FlightDump parse_flight_dump(const std::string& text, const std::string& file);
// Reads and parses `path`; throws rg::Error naming it when it cannot be read.
FlightDump read_flight_dump(const std::string& path);

// The report, one finding per line. Throws rg::Error when two dumps claim the same rank.
std::string analyze_flight_dumps(const std::vector<FlightDump>& dumps);

// The subcommand: `paths` are dump files or directories (whose rank*.json are read). Prints the
// report and returns 0; prints the problem and returns 2 for a missing or bad file.
int run_flight(const std::vector<std::string>& paths);

}  // namespace rg::apps
