// Thread-local autocast state per device type (engine/autocast.h); the casting policy that ops
// apply is engine/ops/autocast_policy.h.
#include "engine/autocast.h"

#include "kernels/error.h"

namespace rg {
namespace {

struct AutocastState {
  bool enabled = false;
  DType dtype;
};
thread_local AutocastState t_cpu{false, DType::bf16};
thread_local AutocastState t_cuda{false, DType::f16};

AutocastState& state(DeviceType device) { return device == DeviceType::cuda ? t_cuda : t_cpu; }

}  // namespace

AutocastGuard::AutocastGuard(DeviceType device, DType dtype, bool enabled) : device_(device) {
  RG_CHECK(is_half(dtype), "autocast: the lower-precision dtype must be f16 or bf16, got ",
           dtype_name(dtype));
  AutocastState& s = state(device);
  prev_enabled_ = s.enabled;
  prev_dtype_ = s.dtype;
  s.enabled = enabled;
  s.dtype = dtype;
}

AutocastGuard::~AutocastGuard() {
  AutocastState& s = state(device_);
  s.enabled = prev_enabled_;
  s.dtype = prev_dtype_;
}

NoAutocastGuard::NoAutocastGuard() : prev_cpu_(t_cpu.enabled), prev_cuda_(t_cuda.enabled) {
  t_cpu.enabled = false;
  t_cuda.enabled = false;
}

NoAutocastGuard::~NoAutocastGuard() {
  t_cpu.enabled = prev_cpu_;
  t_cuda.enabled = prev_cuda_;
}

bool autocast_enabled(DeviceType device) { return state(device).enabled; }
DType autocast_dtype(DeviceType device) { return state(device).dtype; }

}  // namespace rg
