// The current CUDA device (per host thread, as in the CUDA runtime) and a guard that sets it for
// a scope and restores it.
#pragma once

#include "engine/device.h"

namespace rg::cuda {

// Throw rg::Error ("no CUDA device: ...") without a CUDA device.
int current_device();
void set_device(int device);
// Blocks the host until all work queued on `device` (-1: the current one) is done.
void synchronize(int device = -1);

class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  // A CPU device leaves the current CUDA device alone (and needs no CUDA).
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  int original_device() const { return original_; }

 private:
  void enter(int device);
  int original_ = -1;  // -1: nothing to restore
};

}  // namespace rg::cuda
