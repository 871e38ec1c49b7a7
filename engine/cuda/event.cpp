// Events: created lazily on the recording stream's device, recycled by move, destroyed with the
// backend that made them.
#include "engine/cuda/event.h"

#include <utility>

#include "engine/cuda/runtime.h"
#include "kernels/error.h"

namespace rg::cuda {

Event::~Event() { reset(); }

Event::Event(Event&& other) noexcept
    : timing_(other.timing_),
      device_(std::exchange(other.device_, -1)),
      handle_(std::exchange(other.handle_, nullptr)),
      backend_(std::exchange(other.backend_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    timing_ = other.timing_;
    device_ = std::exchange(other.device_, -1);
    handle_ = std::exchange(other.handle_, nullptr);
    backend_ = std::exchange(other.backend_, nullptr);
  }
  return *this;
}

void Event::reset() noexcept {
  if (handle_ == nullptr) return;
  try {
    backend_->destroy_event(device_, handle_);
  } catch (...) {  // a destructor cannot report; the event is leaked
  }
  handle_ = nullptr;
  device_ = -1;
  backend_ = nullptr;
}

void Event::record() { record(current_stream()); }

void Event::record(const Stream& stream) {
  Runtime& rt = runtime();
  const int device = rt.check_device(stream.device_index(), "record an event");
  if (handle_ == nullptr) {
    handle_ = rt.backend().create_event(device, timing_);
    device_ = device;
    backend_ = &rt.backend();
  }
  RG_CHECK(device == device_, "Event::record: the event belongs to cuda:", device_,
           " and cannot be recorded on stream ", stream.str());
  backend_->record_event(device_, handle_, stream.handle());
}

void Event::wait(const Stream& stream) const {
  if (handle_ == nullptr) return;
  backend_->wait_event(stream.device_index(), stream.handle(), handle_);
}

bool Event::query() const { return handle_ == nullptr || backend_->query_event(device_, handle_); }

bool Event::poll() const { return handle_ == nullptr || backend_->poll_event(device_, handle_); }

void Event::synchronize() const {
  if (handle_ != nullptr) backend_->synchronize_event(device_, handle_);
}

float Event::elapsed_ms(const Event& end) const {
  RG_CHECK(timing_ && end.timing_,
           "Event::elapsed_ms: both events must be created with enable_timing=true");
  RG_CHECK(handle_ != nullptr && end.handle_ != nullptr,
           "Event::elapsed_ms: both events must have been recorded");
  RG_CHECK(device_ == end.device_, "Event::elapsed_ms: the events were recorded on cuda:", device_,
           " and cuda:", end.device_);
  return backend_->elapsed_ms(device_, handle_, end.handle_);
}

}  // namespace rg::cuda
