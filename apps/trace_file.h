// Reading the Chrome trace that ringgrad-train --trace writes (engine/trace.h): its events, its
// lane names and the trainer's steps. The one trace reader of ringgrad-bench timeline, scale,
// profile.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace rg::apps {

struct TraceEvent {
  std::string name, cat;
  char ph = 'X';                       // 'X' span, 'i' instant ('M' metadata is not kept)
  double ts = 0, dur = 0;              // microseconds
  int pid = 0, tid = 0;                // process (rank) and lane
  std::map<std::string, double> args;  // the numeric arguments ("bytes", "seq")
};

struct Trace {
  std::string file;
  std::vector<TraceEvent> events;                    // in file order, metadata left out
  std::map<std::pair<int, int>, std::string> lanes;  // (pid, tid) -> lane name
  int processes = 0;                                 // 1 + the highest pid

  const std::string& lane_name(const TraceEvent& e) const;
  // A span on a CUDA stream's lane ("cuda:0/default stream", "cuda:0 NCCL stream"): GPU time.
  bool on_stream(const TraceEvent& e) const;
  // The trainer's steps of process `pid`: the start of each host span of category "step" named
  // "forward", "cuda graph replay" (a --cuda-graphs step replayed: its forward ran only at the
  // capture) or "cuda graph capture" (the step that captures, whose forward inside it does not
  // start another), in time order. Step s runs from starts[s] to starts[s + 1] (the last one to the trace's end).
  std::vector<double> step_starts(int pid) const;
};

// rg::Error naming `file` when the text is not a Chrome trace.
Trace parse_trace(const std::string& text, const std::string& file);
// rg::Error for a file that cannot be read, as parse_trace otherwise.
Trace read_trace(const std::string& path);

}  // namespace rg::apps
