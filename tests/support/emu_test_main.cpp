// GoogleTest main for the emulated CUDA test executables: test_main.cpp's environment fix, plus
// the listener that fails a test leaving stream-race reports behind (emu_race_listener.h).
#include <gtest/gtest.h>

#include "engine/cuda/runtime.h"
#include "kernels/cpu/runtime_env.h"
#include "support/emu_race_listener.h"
#include "support/heap_policy.h"

int main(int argc, char** argv) {
  rg::testing::keep_freed_heap();
  rg::kernels::cpu::ensure_runtime_env(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  rg::testing::install_emu_race_listener();
  const int result = RUN_ALL_TESTS();
  // Work a test left queued on an emulated stream finishes before the static destructors run:
  // the stream threads would otherwise meet libraries (oneDNN) half torn down at exit.
  auto& rt = rg::cuda::runtime();
  for (int d = 0; d < rt.device_count(); ++d) rt.backend().synchronize_device(d);
  return result;
}
