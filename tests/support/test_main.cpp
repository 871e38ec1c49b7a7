// GoogleTest main for all suites; fixes the BLAS/OpenMP environment first (see runtime_env.h).
#include <gtest/gtest.h>

#include "kernels/cpu/runtime_env.h"

int main(int argc, char** argv) {
  rg::kernels::cpu::ensure_runtime_env(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
