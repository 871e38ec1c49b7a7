// GPU-only checks (label gpu): skipped with a message when no CUDA device is present.
#include <gtest/gtest.h>

#include "kernels/cuda/device.h"

namespace rg {
namespace {

TEST(GpuSelfTest, FillKernelRunsOnEveryDevice) {
  const int n = cuda::device_count();
  if (n == 0) GTEST_SKIP() << "no CUDA device (" << cuda::library_versions() << ")";
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE(cuda::device_name(i));
    EXPECT_NO_THROW(cuda::self_test(i));
  }
}

}  // namespace
}  // namespace rg
