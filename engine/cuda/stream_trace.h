// Spans of work on CUDA streams in the trace (engine/trace.h): a timing event before and one
// after the work, placed on the host's steady clock when the trace is taken, so the timeline shows
// when kernels and collectives ran on their streams, not when the host queued them.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "engine/cuda/stream.h"
#include "engine/device.h"
#include "engine/trace.h"

namespace rg::cuda {

// While tracing is enabled: records a start event on `stream` at construction and an end event
// at destruction, and queues the span for the lane called `lane` (e.g. "cuda:0 compute stream").
// trace::take_events() waits for the queued end events and emits the spans. Clock pairing: one
// anchor event per device, recorded on a stream of its own and synchronized once, gives a host
// time for a device time; every span is placed at anchor + cudaEventElapsedTime(anchor, event).
// Costs two events per span, nothing when tracing is off or during a CUDA graph capture (which
// runs nothing: a replay is one span of its own).
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

// The span of one op's work on its device's current stream, named "<module scope>: <op>" (the
// scope: trace::current_scope(), or `scope` when given, as the autograd engine gives a node's).
// The engine's dispatch (engine/dispatch.h) opens one per op ("op"), the autograd engine one per
// backward node ("backward kernels"), the optimizers one per step ("optimizer"), the trainer one
// for the loss ("loss") and one for the batch's copy ("data copy").
// Nesting: only the outermost OpSpan open on a thread records; the ops run inside it (a backward
// node's, an optimizer step's, a composite op's) are part of its span, so each kernel's time is
// counted once. Tracing off, or a CPU device: one relaxed atomic load, nothing else.
class OpSpan {
 public:
  OpSpan(const char* op, const char* category, Device device, const std::string* scope = nullptr) {
    if (device.is_cuda() && trace::enabled()) open(op, category, device, scope);
  }
  ~OpSpan() {
    if (opened_) close();
  }
  OpSpan(const OpSpan&) = delete;
  OpSpan& operator=(const OpSpan&) = delete;

 private:
  void open(const char* op, const char* category, Device device, const std::string* scope);
  void close() noexcept;
  bool opened_ = false;
  std::optional<StreamSpan> span_;  // empty when an outer OpSpan records
};

// The spans queued so far, resolved into trace spans (blocks until their work is done). Called
// by trace::take_events(); safe to call at any time.
void resolve_stream_spans();

}  // namespace rg::cuda
