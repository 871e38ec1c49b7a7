// The current CUDA device and DeviceGuard.
#include "engine/cuda/device_guard.h"

#include "engine/cuda/runtime.h"

namespace rg::cuda {

int current_device() { return runtime().check_device(-1, "query the current device"); }

void set_device(int device) {
  Runtime& rt = runtime();
  rt.backend().set_device(rt.check_device(device, "set the current device"));
}

void synchronize(int device) {
  Runtime& rt = runtime();
  rt.backend().synchronize_device(rt.check_device(device, "synchronize"));
}

DeviceGuard::DeviceGuard(int device) { enter(device); }

DeviceGuard::DeviceGuard(Device device) {
  if (device.is_cuda()) enter(device.index);
}

void DeviceGuard::enter(int device) {
  Runtime& rt = runtime();
  device = rt.check_device(device, "set the current device");
  original_ = rt.backend().current_device();
  if (original_ != device) rt.backend().set_device(device);
}

DeviceGuard::~DeviceGuard() {
  if (original_ < 0) return;
  try {
    Runtime& rt = runtime();
    if (rt.backend().current_device() != original_) rt.backend().set_device(original_);
  } catch (...) {  // a destructor cannot report; the device stays as the scope left it
  }
}

}  // namespace rg::cuda
