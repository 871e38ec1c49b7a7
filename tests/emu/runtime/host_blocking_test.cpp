// The emulated runtime's count of host-blocking calls (kernels/emu/device_runtime.h): exactly the
// calls that make the host wait for device work are counted, once each, per thread, and the
// observer hears their names. The "no host stall in a step" checks of the engine stand on this.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "emu/runtime/runtime_kernels.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/emu/runtime_api.h"

namespace rg::emu_runtime_test {
namespace {

std::vector<std::string>* g_heard = nullptr;
void hear(const char* call) {
  if (g_heard != nullptr) g_heard->push_back(call);
}

class HostBlocking : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
      GTEST_SKIP() << "no emulated device";
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev_), kBytes), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned_), kBytes), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&event_), cudaSuccess);
    g_heard = &heard_;
    emu::set_host_blocking_observer(&hear);
  }
  void TearDown() override {
    emu::set_host_blocking_observer(nullptr);
    g_heard = nullptr;
    if (event_ != nullptr) cudaEventDestroy(event_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    if (dev_ != nullptr) cudaFree(dev_);
  }
  // The calls `f` makes that block the host, as counted on this thread.
  template <class F>
  uint64_t blocking_calls_of(F&& f) {
    const uint64_t before = emu::host_blocking_calls();
    f();
    return emu::host_blocking_calls() - before;
  }

  static constexpr int kN = 256;
  static constexpr size_t kBytes = kN * sizeof(float);
  float* dev_ = nullptr;
  float* pinned_ = nullptr;
  float pageable_[kN] = {};
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
  std::vector<std::string> heard_;
};

TEST_F(HostBlocking, AsynchronousWorkIsNotCounted) {
  EXPECT_EQ(blocking_calls_of([&] {
              set_value(dev_, 1.f, kN, stream_);
              ASSERT_EQ(cudaMemcpyAsync(pinned_, dev_, kBytes, cudaMemcpyDeviceToHost, stream_),
                        cudaSuccess);
              ASSERT_EQ(cudaMemsetAsync(dev_, 0, kBytes, stream_), cudaSuccess);
              ASSERT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
              ASSERT_EQ(cudaStreamWaitEvent(nullptr, event_, 0), cudaSuccess);
            }),
            0u);
  EXPECT_TRUE(heard_.empty());
  cudaStreamSynchronize(stream_);
}

TEST_F(HostBlocking, EachWaitIsCountedOnceByName) {
  set_value(dev_, 1.f, kN, stream_);
  EXPECT_EQ(blocking_calls_of([&] { cudaStreamSynchronize(stream_); }), 1u);
  ASSERT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  EXPECT_EQ(blocking_calls_of([&] { cudaEventSynchronize(event_); }), 1u);
  EXPECT_EQ(blocking_calls_of([&] { cudaDeviceSynchronize(); }), 1u);
  // A copy to pageable memory waits for itself; cudaMemcpy and cudaMemset are one call each,
  // although they synchronize inside.
  EXPECT_EQ(blocking_calls_of(
                [&] { cudaMemcpyAsync(pageable_, dev_, kBytes, cudaMemcpyDeviceToHost, stream_); }),
            1u);
  EXPECT_EQ(blocking_calls_of([&] { cudaMemcpy(pinned_, dev_, kBytes, cudaMemcpyDeviceToHost); }),
            1u);
  EXPECT_EQ(blocking_calls_of([&] { cudaMemset(dev_, 0, kBytes); }), 1u);
  EXPECT_EQ(heard_, (std::vector<std::string>{
                        "cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize",
                        "cudaMemcpyAsync (pageable host memory)", "cudaMemcpy", "cudaMemset"}));
}

TEST_F(HostBlocking, CountsArePerThread) {
  const uint64_t here = emu::host_blocking_calls();
  std::thread other([&] {
    const uint64_t before = emu::host_blocking_calls();
    cudaStreamSynchronize(stream_);
    cudaDeviceSynchronize();
    EXPECT_EQ(emu::host_blocking_calls() - before, 2u);
  });
  other.join();
  EXPECT_EQ(emu::host_blocking_calls(), here);
  EXPECT_EQ(heard_.size(), 2u);  // the observer hears every thread
}

}  // namespace
}  // namespace rg::emu_runtime_test
