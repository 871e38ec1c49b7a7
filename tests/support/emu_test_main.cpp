// GoogleTest main for the emulated CUDA test executables: test_main.cpp's environment fix, plus
// the listener that fails a test leaving stream-race reports behind (emu_race_listener.h).
#include <gtest/gtest.h>

#include "kernels/cpu/runtime_env.h"
#include "support/emu_race_listener.h"

int main(int argc, char** argv) {
  rg::kernels::cpu::ensure_runtime_env(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  rg::testing::install_emu_race_listener();
  return RUN_ALL_TESTS();
}
