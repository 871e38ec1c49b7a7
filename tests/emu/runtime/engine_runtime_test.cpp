// The engine's CUDA runtime (engine/cuda) over the cudart backend on emulated devices.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "emu/runtime/runtime_test_util.h"
#include "engine/cuda/device_guard.h"
#include "engine/cuda/runtime.h"
#include "engine/tensor.h"

namespace rg {
namespace {

using ::rg::emu_runtime_test::AsyncRuntimeTest;

constexpr int64_t kN = 1000;  // 4000 bytes of f32: one 4 KiB block of the small pool

bool all_equal(const Tensor& t, float value) {
  for (float x : t.to(Device::cpu()).to_vector<float>()) {
    if (x != value) return false;
  }
  return true;
}

// Waits for every device, so that the caches hold no block that queued work still uses.
void synchronize_all() {
  for (int d = 0; d < cuda::runtime().device_count(); ++d) cuda::synchronize(d);
}

class EngineCudaRuntime : public AsyncRuntimeTest {
 protected:
  static constexpr int kDevices = 3;
  void SetUp() override {
    ASSERT_GE(cuda::runtime().device_count(), kDevices)
        << "run with RG_EMU_DEVICES=" << kDevices << " (ctest sets it)";
    synchronize_all();
  }
  void TearDown() override { synchronize_all(); }
};

// fill_ and same-device casts launch kernels: on the tensor's device (whose legacy stream the
// null stream then is), not on the caller's current device, where they would race with the
// tensor's own stream (the race detector reports it) and, on a GPU, touch another device's memory.
TEST_F(EngineCudaRuntime, FillAndCastOfATensorOnAnotherDeviceRunOnThatDevice) {
  cuda::DeviceGuard on0(0);
  Tensor t = Tensor::empty({kN}, DType::f32, Device::cuda(2));
  t.fill_(2.5);
  cuda::set_device(0);  // fill_ made cuda:2 current, as ops do; the cast must not depend on that
  const Tensor d = t.to(DType::f64);
  EXPECT_EQ(d.device(), Device::cuda(2));
  EXPECT_EQ(d.to(Device::cpu()).to_vector<double>(), std::vector<double>(size_t(kN), 2.5));
  EXPECT_TRUE(all_equal(t, 2.5f));
}

}  // namespace
}  // namespace rg
