// CUDA discovery: never throws without a driver or GPU; the one-kernel self-test runs where a GPU
// exists (label gpu) and skips with a message otherwise. In CUDA builds, the run-time loading of
// cuBLAS, cuDNN and NCCL (kernels/cuda/dynload.h).
#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda/device.h"
#include "kernels/error.h"
#if defined(RG_WITH_CUDA)
#include "kernels/cuda/dynload.h"
#endif

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

TEST(CudaDevice, UnavailableReasonSaysWhyThereIsNoDevice) {
  const std::string reason = cuda::unavailable_reason();
  if (cuda::device_count() > 0) {
    EXPECT_EQ(reason, "");
    return;
  }
  EXPECT_NE(reason, "");
  if (cuda::built_with_cuda()) {
    // This machine has the toolkit but no GPU: the driver is what is missing or unusable.
    EXPECT_NE(reason.find("driver"), std::string::npos) << reason;
  } else {
    EXPECT_NE(reason.find("without CUDA"), std::string::npos) << reason;
  }
}

#if defined(RG_WITH_CUDA)
// The stubs reach the real libraries: cudnnGetVersion through the loader equals what
// library_versions() (which calls the stub cudnnGetVersion) reports. No GPU needed.
TEST(DynLoad, TheStubsCallTheLibrariesLoadedAtRunTime) {
  using Fn = size_t (*)();
  const auto get_version =
      reinterpret_cast<Fn>(cuda::dynload::symbol(cuda::dynload::Library::Cudnn, "cudnnGetVersion"));
  const size_t version = get_version();
  EXPECT_GE(version, 90000u);
  const std::string versions = cuda::library_versions();
  EXPECT_NE(versions.find("cuDNN " + std::to_string(version)), std::string::npos) << versions;
  EXPECT_EQ(cuda::dynload::load_error(cuda::dynload::Library::Nccl), "");
}

TEST(DynLoad, AMissingLibraryIsNamedWithTheVariableThatPointsToIt) {
  std::string error;
  EXPECT_EQ(cuda::dynload::open(cuda::dynload::Library::Nccl, "/no/such/libnccl.so.2", &error),
            nullptr);
  EXPECT_NE(error.find("NCCL"), std::string::npos) << error;
  EXPECT_NE(error.find("/no/such/libnccl.so.2"), std::string::npos) << error;
  EXPECT_NE(error.find("RG_NCCL_LIBRARY"), std::string::npos) << error;
}

TEST(DynLoad, ASymbolTheLoadedLibraryLacksIsAClearError) {
  try {
    cuda::dynload::symbol(cuda::dynload::Library::Cublas, "cublasNoSuchFunction");
    FAIL() << "expected an rg::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cublasNoSuchFunction"), std::string::npos) << msg;
    EXPECT_NE(msg.find("older than the headers"), std::string::npos) << msg;
  }
}
#endif

}  // namespace
}  // namespace rg
