// StreamSpan's queue and the per-device clock anchors.
#include "engine/cuda/stream_trace.h"

#include <map>
#include <mutex>
#include <vector>

#include "engine/cuda/event.h"
#include "engine/cuda/graph.h"
#include "engine/cuda/runtime.h"
#include "engine/trace.h"

namespace rg::cuda {

struct StreamSpan::Pending {
  std::string name, category, args;
  int lane = 0;
  int device = 0;
  trace::Clock::time_point queued;  // when the host queued the span's work
  Event start{true}, end{true};
};

namespace {

struct Anchor {
  Event event{true};
  trace::Clock::time_point host;
};

struct Queue {
  std::mutex mu;
  std::vector<std::unique_ptr<StreamSpan::Pending>> spans;
  std::map<int, std::unique_ptr<Anchor>> anchors;  // by device
};

Queue& queue() {
  static Queue* q = new Queue;  // never destroyed: spans may be queued from exiting threads
  return *q;
}

// The device's anchor: an event on a stream that has no other work, so synchronizing it costs
// nothing, with the host time at which it was reached.
Anchor& anchor_of(Queue& q, int device) {
  auto& a = q.anchors[device];
  if (!a) {
    a = std::make_unique<Anchor>();
    const Stream own(device, runtime().backend().create_stream(device));
    a->event.record(own);
    a->event.synchronize();
    a->host = trace::Clock::now();
  }
  return *a;
}

trace::Clock::time_point host_time(const Anchor& a, const Event& e) {
  const double ms = a.event.elapsed_ms(e);
  return a.host + std::chrono::duration_cast<trace::Clock::duration>(
                      std::chrono::duration<double, std::milli>(ms));
}

// args_json (a JSON object or "") with "queued_us": how long the work waited between the host
// queuing it and the device starting it (what a host running ahead of the GPU shows; the
// profile attributes GPU spans to the step that queued them with it).
std::string with_queued_us(const std::string& args_json, trace::Clock::duration waited) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(waited).count();
  const std::string field = "\"queued_us\":" + std::to_string(us);
  if (args_json.empty() || args_json == "{}") return "{" + field + "}";
  return args_json.substr(0, args_json.rfind('}')) + "," + field + "}";
}

}  // namespace

StreamSpan::StreamSpan(std::string name, std::string category, const Stream& stream,
                       std::string lane, std::string args_json)
    : stream_(stream) {
  // A CUDA graph's capture runs nothing (its events could not be read); its replays have a span
  // of their own.
  if (!trace::enabled() || Graph::capturing() != nullptr) return;
  {
    Queue& q = queue();
    std::lock_guard lock(q.mu);
    anchor_of(q, stream.device_index());
  }
  pending_ = std::make_unique<Pending>();
  pending_->name = std::move(name);
  pending_->category = std::move(category);
  pending_->args = std::move(args_json);
  pending_->lane = trace::lane_named(lane);
  pending_->device = stream.device_index();
  pending_->queued = trace::Clock::now();
  pending_->start.record(stream);
}

StreamSpan::~StreamSpan() {
  if (!pending_) return;
  try {
    pending_->end.record(stream_);
    trace::set_resolve_hook(&resolve_stream_spans);
    Queue& q = queue();
    std::lock_guard lock(q.mu);
    q.spans.push_back(std::move(pending_));
  } catch (...) {
    // Tracing must never fail the traced work: the span is dropped.
  }
}

namespace {
thread_local int t_open_op_spans = 0;  // OpSpans open on this thread (the outermost records)
}  // namespace

void OpSpan::open(const char* op, const char* category, Device device, const std::string* scope) {
  // A CUDA graph's capture runs nothing; its replays have a span of their own.
  if (Graph::capturing() != nullptr) return;
  opened_ = true;
  if (t_open_op_spans++ > 0) return;
  try {
    const std::string& s = scope ? *scope : trace::current_scope();
    std::string name = s.empty() ? std::string(op) : s + ": " + op;
    const Stream stream = current_stream(device.index);
    span_.emplace(std::move(name), category, stream, stream.str() + " stream");
  } catch (...) {
    // Tracing must never fail the traced work: the span is dropped.
  }
}

void OpSpan::close() noexcept {
  span_.reset();
  --t_open_op_spans;
}

void resolve_stream_spans() {
  Queue& q = queue();
  std::vector<std::unique_ptr<StreamSpan::Pending>> spans;
  {
    std::lock_guard lock(q.mu);
    spans.swap(q.spans);
  }
  for (auto& s : spans) {
    s->end.synchronize();
    std::lock_guard lock(q.mu);
    const Anchor& a = anchor_of(q, s->device);
    const trace::Clock::time_point start = host_time(a, s->start);
    trace::deferred_span(std::move(s->name), std::move(s->category), start, host_time(a, s->end),
                         s->lane, with_queued_us(s->args, start - s->queued));
  }
}

}  // namespace rg::cuda
