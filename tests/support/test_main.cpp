// GoogleTest main for all suites; fixes the BLAS/OpenMP environment first (see runtime_env.h) and
// sets the tests' malloc policy (support/heap_policy.h).
#include <gtest/gtest.h>

#include "kernels/cpu/runtime_env.h"
#include "support/heap_policy.h"

int main(int argc, char** argv) {
  rg::testing::keep_freed_heap();
  rg::kernels::cpu::ensure_runtime_env(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
