// Streams and the per-thread current stream of each device.
#include "engine/cuda/stream.h"

#include <sstream>

#include "engine/cuda/event.h"
#include "engine/cuda/runtime.h"

namespace rg::cuda {

bool Stream::query() const { return runtime().backend().query_stream(device_, handle_); }

void Stream::synchronize() const { runtime().backend().synchronize_stream(device_, handle_); }

void Stream::wait(const Event& event) const { event.wait(*this); }

void Stream::wait(const Stream& other) const {
  if (other == *this) return;
  Event e;
  e.record(other);
  e.wait(*this);
}

std::string Stream::str() const {
  std::ostringstream os;
  os << "cuda:" << device_ << '/';
  if (handle_ == nullptr) {
    os << "default";
  } else {
    os << handle_;
  }
  return os.str();
}

Stream default_stream(int device) {
  return Stream(runtime().check_device(device, "use a stream"), nullptr);
}

Stream current_stream(int device) {
  Runtime& rt = runtime();
  device = rt.check_device(device, "use a stream");
  return Stream(device, rt.current_stream(device));
}

Stream pooled_stream(int device) {
  Runtime& rt = runtime();
  device = rt.check_device(device, "use a stream");
  return Stream(device, rt.pooled_stream(device));
}

void set_current_stream(const Stream& stream) {
  Runtime& rt = runtime();
  rt.set_current_stream(rt.check_device(stream.device_index(), "set the current stream"),
                        stream.handle());
}

StreamGuard::StreamGuard(const Stream& stream)
    : previous_stream_(current_stream(stream.device_index())),
      previous_device_(runtime().backend().current_device()) {
  Runtime& rt = runtime();
  if (previous_device_ != stream.device_index()) rt.backend().set_device(stream.device_index());
  rt.set_current_stream(stream.device_index(), stream.handle());
}

StreamGuard::~StreamGuard() {
  Runtime& rt = runtime();
  rt.set_current_stream(previous_stream_.device_index(), previous_stream_.handle());
  if (previous_device_ != previous_stream_.device_index()) {
    try {
      rt.backend().set_device(previous_device_);
    } catch (...) {  // a destructor cannot report; the device stays as the guard left it
    }
  }
}

}  // namespace rg::cuda
