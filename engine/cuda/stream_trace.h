// Spans of work on CUDA streams in the trace (engine/trace.h): a timing event before and one
// after the work, placed on the host's steady clock when the trace is taken, so the timeline shows
// when kernels and collectives ran on their streams, not when the host queued them.
#pragma once

#include <memory>
#include <string>

#include "engine/cuda/stream.h"

namespace rg::cuda {

// While tracing is enabled: records a start event on `stream` at construction and an end event
// at destruction, and queues the span for the lane called `lane` (e.g. "cuda:0 compute stream").
// trace::take_events() waits for the queued end events and emits the spans. Clock pairing: one
// anchor event per device, recorded on a stream of its own and synchronized once, gives a host
// time for a device time; every span is placed at anchor + cudaEventElapsedTime(anchor, event).
// Costs two events per span, nothing when tracing is off.
class StreamSpan {
 public:
  StreamSpan(std::string name, std::string category, const Stream& stream, std::string lane,
             std::string args_json = "");
  ~StreamSpan();
  StreamSpan(const StreamSpan&) = delete;
  StreamSpan& operator=(const StreamSpan&) = delete;

  struct Pending;

 private:
  std::unique_ptr<Pending> pending_;  // null while tracing is off
  Stream stream_;
};

// The spans queued so far, resolved into trace spans (blocks until their work is done). Called
// by trace::take_events(); safe to call at any time.
void resolve_stream_spans();

}  // namespace rg::cuda
