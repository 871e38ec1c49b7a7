// CUDA discovery: never throws without a driver or GPU; the one-kernel self-test runs where a GPU
// exists (label gpu) and skips with a message otherwise.
#include <gtest/gtest.h>

#include "kernels/cuda/device.h"
#include "kernels/error.h"

namespace rg {
namespace {

TEST(CudaDevice, CountNeverThrows) {
  int n = -1;
  EXPECT_NO_THROW(n = cuda::device_count());
  EXPECT_GE(n, 0);
  EXPECT_FALSE(cuda::library_versions().empty());
  EXPECT_THROW(cuda::device_name(n), Error);  // one past the last device
}

TEST(CudaDevice, SelfTestWithoutDeviceIsAClearError) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present; covered by GpuSelfTest";
  try {
    cuda::self_test(0);
    FAIL() << "self_test should fail without a GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("does not exist") != std::string::npos ||
                msg.find("without CUDA") != std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace rg
