// CUDA events: mark a point in a stream's work, to order other streams after it, to wait for it
// on the host, or to time the work between two of them.
#pragma once

#include "engine/cuda/backend.h"
#include "engine/cuda/stream.h"

namespace rg::cuda {

// The CUDA event is created on first record(), on the device of that stream; an event never
// recorded counts as reached. Move-only; destroys its CUDA event.
class Event {
 public:
  explicit Event(bool enable_timing = false) : timing_(enable_timing) {}
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record();  // on the current stream of the current device
  void record(const Stream& stream);
  // `stream` waits for this event (no-op when never recorded); the host does not block.
  void wait(const Stream& stream) const;
  bool query() const;        // reached (or never recorded)
  // query() for bookkeeping (the NCCL watchdog): the same answer; under the emulator's race
  // detector it does not order the caller's host work after the event (Backend::poll_event).
  bool poll() const;
  void synchronize() const;  // blocks the host until reached
  // Milliseconds from this event to `end`; both recorded with timing enabled, both reached.
  float elapsed_ms(const Event& end) const;

  bool recorded() const { return handle_ != nullptr; }
  int device_index() const { return device_; }
  EventHandle handle() const { return handle_; }

 private:
  void reset() noexcept;
  bool timing_;
  int device_ = -1;
  EventHandle handle_ = nullptr;
  Backend* backend_ = nullptr;  // the one that created handle_
};

}  // namespace rg::cuda
