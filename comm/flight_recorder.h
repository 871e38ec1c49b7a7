// The flight recorder: every process keeps its last N collective calls (what, and when they were
// enqueued, started and ended) in a ring buffer, always on; on a timeout, an error, SIGUSR1 or a
// launcher's request every rank writes it to a file, and `ringgrad-bench flight FILES...`
// (apps/flight_analyzer.h) reads all ranks' files and says what happened.
//
// The dump is JSON:
//   {"version": 1, "rank": 0, "world_size": 2, "pid": 123, "host": "...", "reason": "timeout",
//    "dumped_at": 1764100000.123 (unix seconds), "capacity": 2048, "recorded": 51 (calls ever
//    recorded; recorded > entries.size() means the oldest were overwritten),
//    "entries": [ oldest first:
//      {"id": 17, "group": "default", "seq": 12, "op": "all_reduce", "reduce_op": "sum",
//       "root": -1, "tag": 0, "dtype": "f32", "shapes": [[1000]], "device": "cpu",
//       "state": "enqueued" | "started" | "completed" | "failed",
//       "enqueued_at": unix s, "started_at": unix s or null, "ended_at": unix s or null,
//       "error": "..." (failed only)} ] }
// Times are unix seconds (system clock), so the files of ranks on one host compare directly.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "comm/collective_call.h"

namespace rg::dist {

class FlightRecorder {
 public:
  // The process's recorder (capacity: RG_FLIGHT_RECORDER_SIZE, default 2048; 0 turns it off).
  static FlightRecorder& global();
  explicit FlightRecorder(size_t capacity);

  // A call was handed to its backend; returns its id for the calls below (0 when off).
  uint64_t enqueued(const CollectiveCall& call);
  // The backend started it (Work::start_time) / it finished, with an error message when it failed.
  // Safe from any thread; ids already overwritten in the ring are ignored.
  void started(uint64_t id, double unix_s);
  void ended(uint64_t id, double unix_s, const std::string& error = {});

  // The dump (the JSON above) of what is in the ring now.
  std::string dump_json(const std::string& reason, int rank, int world_size) const;
  // Writes dump_json to the file for `rank` (RG_FLIGHT_RECORDER_DIR, default
  // /tmp/ringgrad-flight/<MASTER_PORT or pid>/, file rank<r>.json), atomically; returns its path
  // ("" when off or the write failed; never throws: it runs on error paths).
  std::string dump_to_file(const std::string& reason, int rank, int world_size) const;

  // Installs, once per process, a SIGUSR1 handler and a thread that dumps when the signal comes
  // (the handler only wakes the thread), with the rank and size given (init_process_group calls
  // it).
  static void install_signal_dump(int rank, int world_size);

  size_t capacity() const { return capacity_; }

 private:
  struct Entry {
    uint64_t id = 0;
    CollectiveCall call;
    double enqueued_at = 0, started_at = -1, ended_at = -1;
    std::string error;
    bool failed = false;
  };
  size_t capacity_;
  mutable std::mutex mu_;
  std::vector<Entry> ring_;
  uint64_t next_id_ = 1;
};

// Unix seconds now (the recorder's clock).
double unix_seconds();

}  // namespace rg::dist
