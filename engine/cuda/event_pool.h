// Recycled CUDA events for the caching allocators: a block freed while other streams still use it
// is released when an event recorded on each of those streams is reached. Creating events in the
// steady state would cost a driver call per free, so they are kept per device and reused.
#pragma once

#include <vector>

#include "engine/cuda/backend.h"

namespace rg::cuda {

class EventPool {
 public:
  explicit EventPool(Backend& backend) : backend_(backend) {}
  ~EventPool() {
    for (size_t d = 0; d < free_.size(); ++d) {
      for (EventHandle e : free_[d]) {
        try {
          backend_.destroy_event(int(d), e);
        } catch (...) {  // a destructor cannot report; the event is simply leaked
        }
      }
    }
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  EventHandle get(int device) {
    if (size_t(device) < free_.size() && !free_[size_t(device)].empty()) {
      EventHandle e = free_[size_t(device)].back();
      free_[size_t(device)].pop_back();
      return e;
    }
    return backend_.create_event(device, /*enable_timing=*/false);
  }
  void put(int device, EventHandle e) {
    if (free_.size() <= size_t(device)) free_.resize(size_t(device) + 1);
    free_[size_t(device)].push_back(e);
  }

 private:
  Backend& backend_;
  std::vector<std::vector<EventHandle>> free_;  // by device
};

}  // namespace rg::cuda
