// The emulated CUDA runtime is asynchronous like a GPU (work runs after the launch returns, events
// and the legacy default stream order streams, pageable copies block the host) and its race
// detector reports the ordering bugs a synchronous emulator hides: each mutation of a correct
// pattern (a removed event wait, a removed record_stream) must be reported, the pattern must not.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine/cuda/device_guard.h"
#include "engine/cuda/event.h"
#include "engine/cuda/memory.h"
#include "engine/cuda/stream.h"
#include "engine/tensor.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/error.h"

namespace rg {
namespace {

using namespace std::chrono_literals;

// Holds a stream busy until released (or 5 s pass, so a failing test cannot hang).
struct Gate {
  std::atomic<bool> open{false};
  static void wait(void* p) {
    auto* g = static_cast<Gate*>(p);
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!g->open.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
  }
  void hold(cudaStream_t s) { ASSERT_EQ(cudaLaunchHostFunc(s, &Gate::wait, this), cudaSuccess); }
  ~Gate() { open = true; }
};

void set_flag(void* p) { static_cast<std::atomic<int>*>(p)->store(1); }

cudaStream_t new_stream(unsigned flags = cudaStreamNonBlocking) {
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
  return s;
}

TEST(EmuAsyncRuntime, WorkRunsAfterTheLaunchReturns) {
  cudaStream_t s = new_stream();
  Gate gate;
  gate.hold(s);
  std::atomic<int> ran{0};
  ASSERT_EQ(cudaLaunchHostFunc(s, &set_flag, &ran), cudaSuccess);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  gate.open = true;
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
}

TEST(EmuAsyncRuntime, StreamsRunConcurrentlyAndEventWaitsOrderThem) {
  cudaStream_t a = new_stream(), b = new_stream();
  Gate gate;
  gate.hold(a);
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
  std::atomic<int> independent{0}, ordered{0};
  ASSERT_EQ(cudaLaunchHostFunc(b, &set_flag, &independent), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);  // b does not wait for the held a
  EXPECT_EQ(independent.load(), 1);
  ASSERT_EQ(cudaStreamWaitEvent(b, e, 0), cudaSuccess);  // returns: the host is not blocked
  ASSERT_EQ(cudaLaunchHostFunc(b, &set_flag, &ordered), cudaSuccess);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(ordered.load(), 0);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
  gate.open = true;
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(ordered.load(), 1);
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
}

TEST(EmuAsyncRuntime, TheLegacyDefaultStreamWaitsForBlockingStreamsOnly) {
  cudaStream_t blocking = new_stream(cudaStreamDefault), non_blocking = new_stream();
  std::atomic<int> after_non_blocking{0}, after_blocking{0};
  {
    Gate gate;
    gate.hold(non_blocking);
    ASSERT_EQ(cudaLaunchHostFunc(nullptr, &set_flag, &after_non_blocking), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    EXPECT_EQ(after_non_blocking.load(), 1);
  }
  Gate gate;
  gate.hold(blocking);
  ASSERT_EQ(cudaLaunchHostFunc(nullptr, &set_flag, &after_blocking), cudaSuccess);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(after_blocking.load(), 0);
  gate.open = true;
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(after_blocking.load(), 1);
}

TEST(EmuAsyncRuntime, PageableCopiesBlockTheHostPinnedOnesDoNot) {
  cudaStream_t s = new_stream();
  void* device = nullptr;
  void* pinned = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 4096), cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(&pinned, 4096, cudaHostAllocDefault), cudaSuccess);
  std::vector<char> pageable(4096, 7);
  Gate gate;
  gate.hold(s);
  ASSERT_EQ(cudaMemcpyAsync(device, pinned, 4096, cudaMemcpyHostToDevice, s), cudaSuccess);
  std::atomic<bool> returned{false};
  std::thread copier([&] {
    EXPECT_EQ(cudaMemcpyAsync(device, pageable.data(), 4096, cudaMemcpyHostToDevice, s),
              cudaSuccess);
    returned = true;
  });
  std::this_thread::sleep_for(30ms);
  EXPECT_FALSE(returned.load()) << "a pageable copy returned before its stream reached it";
  gate.open = true;
  copier.join();
  EXPECT_TRUE(returned.load());
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(static_cast<char*>(device)[4095], 7);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

TEST(EmuAsyncRuntime, EventsTimeTheEmulatedWork) {
  cudaStream_t s = new_stream();
  cudaEvent_t start = nullptr, end = nullptr;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(start, s), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(
                s, [](void*) { std::this_thread::sleep_for(20ms); }, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(end, s), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(end), cudaSuccess);
  float ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 15.f);
  EXPECT_LT(ms, 2000.f);
  cudaEventDestroy(start);
  cudaEventDestroy(end);
}

// Engine-level ordering through Stream/Event, as DDP and ProcessGroupNCCL use them.
class EmuRaceDetector : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(emu::racecheck_enabled());
    emu::clear_race_reports();
  }
  void TearDown() override {
    cuda::synchronize(0);
    emu::clear_race_reports();
  }
  static Tensor ones(int64_t n) {
    Tensor t = Tensor::empty({n}, DType::f32, Device::cuda(0));
    t.fill_(1.0);
    return t;
  }
};

TEST_F(EmuRaceDetector, AnEventWaitOrdersAProducerAndAConsumer) {
  Tensor x = ones(1000);
  cuda::Stream side = cuda::pooled_stream(0);
  cuda::Event produced;
  produced.record(cuda::current_stream(0));
  side.wait(produced);
  {
    cuda::StreamGuard guard(side);
    x.fill_(2.0);
  }
  cuda::current_stream(0).wait(side);
  EXPECT_EQ(x.narrow(0, 999, 1).item<float>(), 2.f);
  EXPECT_TRUE(emu::race_reports().empty());
}

TEST_F(EmuRaceDetector, ARemovedEventWaitIsReportedNamingBothStreams) {
  Tensor x = ones(1000);  // written on the default stream
  cuda::Stream side = cuda::pooled_stream(0);
  cuda::StreamGuard guard(side);
  try {
    x.fill_(2.0);  // no wait for the default stream's write
    FAIL() << "the unordered write was not reported";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("stream race"), std::string::npos) << m;
    EXPECT_NE(m.find("cuda:0/default"), std::string::npos) << m;
    EXPECT_NE(m.find("cuda:0/stream"), std::string::npos) << m;
  }
  EXPECT_FALSE(emu::race_reports().empty());
}

TEST_F(EmuRaceDetector, AFreeWithoutRecordStreamIsReportedAndWithItIsNot) {
  for (bool record : {true, false}) {
    emu::clear_race_reports();
    cuda::Stream side = cuda::pooled_stream(0);
    {
      Tensor x = ones(4096);  // allocated for the default stream
      side.wait(cuda::current_stream(0));
      {
        cuda::StreamGuard guard(side);
        x.fill_(3.0);  // used on the side stream
      }
      if (record) cuda::record_stream(x, side);
    }  // freed while the side stream may still use it
    const auto reports = emu::race_reports();
    if (record) {
      EXPECT_TRUE(reports.empty()) << reports.front();
    } else {
      ASSERT_FALSE(reports.empty()) << "a free without record_stream was not reported";
      EXPECT_NE(reports.front().find("was freed"), std::string::npos) << reports.front();
      EXPECT_NE(reports.front().find("record_stream"), std::string::npos) << reports.front();
    }
    side.synchronize();
  }
}

TEST_F(EmuRaceDetector, ReadsOnTwoStreamsNeedNoOrdering) {
  Tensor x = ones(1000);
  cuda::Stream side = cuda::pooled_stream(0);
  side.wait(cuda::current_stream(0));
  Tensor a = x.to(Device::cpu());  // a read on the default stream
  {
    cuda::StreamGuard guard(side);
    Tensor b = x.to(Device::cpu());  // and one on the side stream
    EXPECT_EQ(b.narrow(0, 999, 1).item<float>(), 1.f);
  }
  EXPECT_TRUE(emu::race_reports().empty());
}

}  // namespace
}  // namespace rg
