// The emulated CUDA runtime through its API: streams run their work asynchronously, in order and
// concurrently with each other; events, the legacy default stream, copies, devices, sticky errors
// and launch blocking behave as CUDA specifies. The asynchrony tests hold streams with gates, so a
// synchronous runtime fails them (at the gates' deadlines) instead of hanging.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "emu/runtime/runtime_kernels.h"
#include "emu/runtime/runtime_test_util.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/emu/launch.h"
#include "kernels/emu/runtime_api.h"
#include "kernels/error.h"
#include "support/errors.h"

namespace rg::emu_runtime_test {
namespace {

using ::rg::testing::error_of;

constexpr int kN = 1000;  // floats in the buffers (several blocks of the test kernels)

// Host functions: count calls, sleep, fail.
void count_call(void* counter) { static_cast<std::atomic<int>*>(counter)->fetch_add(1); }
void sleep_20ms(void*) { std::this_thread::sleep_for(20ms); }
void sleep_then_count(void* counter) {
  std::this_thread::sleep_for(30ms);
  count_call(counter);
}
void throw_from_host_function(void*) { throw std::runtime_error("boom from the host function"); }

std::chrono::milliseconds since(SteadyClock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t0);
}

bool all_equal(const float* p, int n, float value) {
  return std::all_of(p, p + n, [&](float x) { return x == value; });
}

class StreamRuntime : public AsyncRuntimeTest {};

// ---- Asynchrony ----

TEST_F(StreamRuntime, ALaunchReturnsWhileItsStreamIsHeld) {
  std::atomic<int> ran{0};
  TestStream s;
  StreamGate gate;
  ASSERT_EQ(gate.hold(s), cudaSuccess);
  const auto t0 = SteadyClock::now();
  ASSERT_EQ(cudaLaunchHostFunc(s, &count_call, &ran), cudaSuccess);
  EXPECT_LT(since(t0), 2s) << "the launch waited for the held stream";
  ASSERT_TRUE(gate.wait_reached()) << "the stream never started its work";
  std::this_thread::sleep_for(kSettle);
  EXPECT_EQ(ran.load(), 0) << "work ran past the held host function";
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);

  gate.release();
  ASSERT_TRUE(wait_idle(s));
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  EXPECT_FALSE(gate.timed_out());
}

TEST_F(StreamRuntime, AKernelRunsAfterItsLaunchReturns) {
  TestStream s;
  DeviceBuffer d(kN);
  ASSERT_EQ(cudaMemset(d.get(), 0, d.bytes()), cudaSuccess);
  StreamGate gate;
  ASSERT_EQ(gate.hold(s), cudaSuccess);
  set_value(d.get(), 7.f, kN, s);
  ASSERT_TRUE(gate.wait_reached());
  std::this_thread::sleep_for(kSettle);
  // Emulated device memory is host memory: the host can look before the kernel has run.
  EXPECT_TRUE(all_equal(d.get(), kN, 0.f)) << "the kernel ran before its stream reached it";

  gate.release();
  ASSERT_TRUE(wait_idle(s));
  EXPECT_TRUE(all_equal(d.get(), kN, 7.f));
}

// ---- Concurrency between streams ----

TEST_F(StreamRuntime, TwoNonBlockingStreamsRunConcurrently) {
  RG_REQUIRE_CONCURRENT_STREAMS();
  std::atomic<int> ran{0};
  TestStream a, b;
  StreamGate gate;
  ASSERT_EQ(gate.hold(a), cudaSuccess);
  ASSERT_TRUE(gate.wait_reached());
  ASSERT_EQ(cudaLaunchHostFunc(b, &count_call, &ran), cudaSuccess);
  EXPECT_TRUE(wait_idle(b)) << "stream b waited for the held stream a";
  EXPECT_EQ(ran.load(), 1);
  EXPECT_FALSE(gate.passed()) << "b finished only after a was let go";
  EXPECT_EQ(cudaStreamQuery(a), cudaErrorNotReady);
  gate.release();
  EXPECT_TRUE(wait_idle(a));
}

// ---- Order within a stream ----

struct OrderLog {
  std::mutex mu;
  std::vector<int> order;
};
struct Step {
  OrderLog* log;
  int index;
  int sleep_ms;
};
void log_step(void* p) {
  const auto* step = static_cast<const Step*>(p);
  std::this_thread::sleep_for(std::chrono::milliseconds(step->sleep_ms));
  std::lock_guard lock(step->log->mu);
  step->log->order.push_back(step->index);
}

TEST_F(StreamRuntime, WorkOnOneStreamRunsInQueueOrder) {
  constexpr int kSteps = 8;
  OrderLog log;
  std::vector<Step> steps(kSteps);
  TestStream s;
  StreamGate gate;
  ASSERT_EQ(gate.hold(s), cudaSuccess);
  // The earliest steps sleep longest: run concurrently or out of order, they would log last.
  for (int i = 0; i < kSteps; ++i) {
    steps[size_t(i)] = Step{&log, i, 3 * (kSteps - i)};
    ASSERT_EQ(cudaLaunchHostFunc(s, &log_step, &steps[size_t(i)]), cudaSuccess);
  }
  gate.release();
  ASSERT_TRUE(wait_idle(s));
  std::vector<int> expected(kSteps);
  std::iota(expected.begin(), expected.end(), 0);
  std::lock_guard lock(log.mu);
  EXPECT_EQ(log.order, expected);
}

struct ReadFirst {
  const float* src;
  float seen;
};
void read_first(void* p) {
  auto* r = static_cast<ReadFirst*>(p);
  r->seen = r->src[0];
}

TEST_F(StreamRuntime, KernelsCopiesMemsetsAndHostFunctionsRunInQueueOrder) {
  PinnedBuffer out(kN);
  std::fill(out.get(), out.get() + kN, -1.f);
  ReadFirst probe{out.get(), -1.f};
  TestStream s;
  DeviceBuffer d(kN), e(kN);
  StreamGate gate;
  ASSERT_EQ(gate.hold(s), cudaSuccess);
  // d = 0, d = 2, e = 3 d, out = e, probe reads out, then e and d are cleared: each step sees the
  // previous one's result only if they run in this order.
  ASSERT_EQ(cudaMemsetAsync(d.get(), 0, d.bytes(), s), cudaSuccess);
  set_value(d.get(), 2.f, kN, s);
  scale(d.get(), e.get(), 3.f, kN, s);
  ASSERT_EQ(cudaMemcpyAsync(out.get(), e.get(), e.bytes(), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(s, &read_first, &probe), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(e.get(), 0, e.bytes(), s), cudaSuccess);
  set_value(d.get(), -5.f, kN, s);
  gate.release();
  ASSERT_TRUE(wait_idle(s));
  EXPECT_TRUE(all_equal(out.get(), kN, 6.f)) << "out[0] = " << out.get()[0];
  EXPECT_EQ(probe.seen, 6.f);
  EXPECT_TRUE(all_equal(e.get(), kN, 0.f));
  EXPECT_TRUE(all_equal(d.get(), kN, -5.f));
}

// ---- Stream waits ----

TEST_F(StreamRuntime, StreamWaitEventOrdersLaterWorkWithoutBlockingTheHost) {
  RG_REQUIRE_CONCURRENT_STREAMS();
  std::atomic<int> before_wait{0}, after_wait{0};
  TestStream a, b;
  TestEvent e;
  StreamGate gate;
  ASSERT_EQ(gate.hold(a), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(b, &count_call, &before_wait), cudaSuccess);
  const auto t0 = SteadyClock::now();
  ASSERT_EQ(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(b, &count_call, &after_wait), cudaSuccess);
  EXPECT_LT(since(t0), 2s) << "the host waited for the event";
  // Work queued on b before the wait is not held back.
  EXPECT_TRUE(eventually([&] { return before_wait.load() == 1; }));
  std::this_thread::sleep_for(kSettle);
  EXPECT_EQ(after_wait.load(), 0) << "b ran past its wait for a's event";
  EXPECT_EQ(cudaStreamQuery(b), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);

  gate.release();
  ASSERT_TRUE(wait_idle(b));
  EXPECT_EQ(after_wait.load(), 1);
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
}

TEST_F(StreamRuntime, WaitingForANeverRecordedEventIsANoOp) {
  RG_REQUIRE_CONCURRENT_STREAMS();
  std::atomic<int> ran{0};
  TestStream a, b;
  TestEvent e;
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);  // never recorded: counts as reached
  EXPECT_EQ(cudaEventSynchronize(e), cudaSuccess);
  StreamGate gate;
  ASSERT_EQ(gate.hold(a), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
  // The wait took the event as it was when queued: recording it now, on the held stream, must not
  // hold back the work queued after the wait.
  ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(b, &count_call, &ran), cudaSuccess);
  EXPECT_TRUE(wait_idle(b)) << "b waited for an event that was not recorded when it was told to";
  EXPECT_EQ(ran.load(), 1);
  EXPECT_FALSE(gate.passed());
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);  // now recorded behind the gate
}

// ---- The legacy default stream ----

TEST_F(StreamRuntime, TheLegacyStreamWaitsForAHeldBlockingStream) {
  std::atomic<int> legacy_ran{0}, after_legacy_ran{0};
  TestStream blocking(/*blocking=*/true), other_blocking(/*blocking=*/true);
  StreamGate gate;
  ASSERT_EQ(gate.hold(blocking), cudaSuccess);
  ASSERT_TRUE(gate.wait_reached());
  ASSERT_EQ(cudaLaunchHostFunc(nullptr, &count_call, &legacy_ran), cudaSuccess);
  // A blocking stream waits for the legacy work, which waits for the held stream: transitively.
  ASSERT_EQ(cudaLaunchHostFunc(other_blocking, &count_call, &after_legacy_ran), cudaSuccess);
  std::this_thread::sleep_for(kSettle);
  EXPECT_EQ(legacy_ran.load(), 0) << "the legacy stream did not wait for a blocking stream";
  EXPECT_EQ(after_legacy_ran.load(), 0);
  EXPECT_EQ(cudaStreamQuery(nullptr), cudaErrorNotReady);

  gate.release();
  ASSERT_TRUE(wait_idle(nullptr));
  ASSERT_TRUE(wait_idle(other_blocking));
  EXPECT_EQ(legacy_ran.load(), 1);
  EXPECT_EQ(after_legacy_ran.load(), 1);
}

TEST_F(StreamRuntime, TheLegacyStreamDoesNotWaitForANonBlockingStream) {
  RG_REQUIRE_CONCURRENT_STREAMS();
  std::atomic<int> ran{0};
  TestStream non_blocking;
  StreamGate gate;
  ASSERT_EQ(gate.hold(non_blocking), cudaSuccess);
  ASSERT_TRUE(gate.wait_reached());
  ASSERT_EQ(cudaLaunchHostFunc(nullptr, &count_call, &ran), cudaSuccess);
  EXPECT_TRUE(wait_idle(nullptr)) << "the legacy stream waited for a non-blocking stream";
  EXPECT_EQ(ran.load(), 1);
  EXPECT_FALSE(gate.passed());
}

TEST_F(StreamRuntime, ABlockingStreamWaitsForHeldLegacyWork) {
  std::atomic<int> ran{0};
  TestStream blocking(/*blocking=*/true);
  StreamGate gate;
  ASSERT_EQ(gate.hold(nullptr), cudaSuccess);
  ASSERT_TRUE(gate.wait_reached());
  ASSERT_EQ(cudaLaunchHostFunc(blocking, &count_call, &ran), cudaSuccess);
  std::this_thread::sleep_for(kSettle);
  EXPECT_EQ(ran.load(), 0) << "a blocking stream did not wait for the legacy stream";
  EXPECT_EQ(cudaStreamQuery(blocking), cudaErrorNotReady);
  gate.release();
  ASSERT_TRUE(wait_idle(blocking));
  EXPECT_EQ(ran.load(), 1);
}

TEST_F(StreamRuntime, ANonBlockingStreamDoesNotWaitForLegacyWork) {
  RG_REQUIRE_CONCURRENT_STREAMS();
  std::atomic<int> ran{0};
  TestStream non_blocking;
  StreamGate gate;
  ASSERT_EQ(gate.hold(nullptr), cudaSuccess);
  ASSERT_TRUE(gate.wait_reached());
  ASSERT_EQ(cudaLaunchHostFunc(non_blocking, &count_call, &ran), cudaSuccess);
  EXPECT_TRUE(wait_idle(non_blocking)) << "a non-blocking stream waited for the legacy stream";
  EXPECT_EQ(ran.load(), 1);
  EXPECT_FALSE(gate.passed());
}

// ---- Events ----

TEST_F(StreamRuntime, EventsTimeTheStreamsWorkBetweenThem) {
  TestStream s;
  TestEvent start, end;
  StreamGate gate;
  ASSERT_EQ(gate.hold(s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(start, s), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(s, &sleep_20ms, nullptr), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(end, s), cudaSuccess);
  ASSERT_TRUE(gate.wait_reached());
  EXPECT_EQ(cudaEventQuery(start), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(end), cudaErrorNotReady);
  float ms = -1.f;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaErrorNotReady);
  // The stream is held before `start`: this time must not count, nor may the times be taken when
  // the records were queued (that would measure about 0 ms).
  std::this_thread::sleep_for(300ms);

  gate.release();
  ASSERT_TRUE(wait_reached(end));
  EXPECT_EQ(cudaEventSynchronize(end), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(start), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 15.f);
  EXPECT_LT(ms, 250.f) << "the time the stream was held before `start` was counted";
}

TEST_F(StreamRuntime, ElapsedTimeNeedsTwoRecordedTimingEvents) {
  TestStream s;
  TestEvent untimed_a(cudaEventDisableTiming), untimed_b(cudaEventDisableTiming), timed,
      never_recorded;
  ASSERT_EQ(cudaEventRecord(untimed_a, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(timed, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed_b, s), cudaSuccess);
  ASSERT_TRUE(wait_reached(untimed_b));
  float ms = -1.f;
  EXPECT_EQ(cudaEventElapsedTime(&ms, untimed_a, untimed_b), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed, untimed_b), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed, never_recorded), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(ms, -1.f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read and cleared
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed, timed), cudaSuccess);
  EXPECT_EQ(ms, 0.f);
}

// ---- Pageable and pinned copies ----

TEST_F(StreamRuntime, APageableCopyReturnsOnlyWhenItIsDone) {
  const std::vector<float> src(kN, 3.5f);
  std::vector<float> back(kN, 0.f), back_at_return;
  cudaError_t to_device = cudaErrorInvalidValue, to_host = cudaErrorInvalidValue;
  std::atomic<bool> returned{false};
  TestStream s;
  DeviceBuffer d(kN);
  StreamGate gate;
  ASSERT_EQ(gate.hold(s), cudaSuccess);
  ASSERT_TRUE(gate.wait_reached());
  // Pageable copies wait for their stream, which is held: they are made from another thread.
  std::thread copier([&] {
    to_device = cudaMemcpyAsync(d.get(), src.data(), d.bytes(), cudaMemcpyHostToDevice, s);
    to_host = cudaMemcpyAsync(back.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost, s);
    back_at_return = back;  // no synchronize: the data must be there when the call returns
    returned = true;
  });
  ScopeExit join([&] {
    gate.release();
    copier.join();
  });
  std::this_thread::sleep_for(2 * kSettle);
  EXPECT_FALSE(returned.load()) << "a pageable copy returned before its stream reached it";

  gate.release();
  ASSERT_TRUE(eventually([&] { return returned.load(); }));
  EXPECT_EQ(to_device, cudaSuccess);
  EXPECT_EQ(to_host, cudaSuccess);
  EXPECT_EQ(back_at_return, src);
  EXPECT_FALSE(gate.timed_out());
}

TEST_F(StreamRuntime, ACopyWithPinnedMemoryReturnsAtOnce) {
  PinnedBuffer src(kN), back(kN);
  std::fill(src.get(), src.get() + kN, 4.25f);
  std::fill(back.get(), back.get() + kN, 0.f);
  TestStream s;
  DeviceBuffer d(kN);
  ASSERT_EQ(cudaMemset(d.get(), 0, d.bytes()), cudaSuccess);
  StreamGate gate;
  ASSERT_EQ(gate.hold(s), cudaSuccess);
  const auto t0 = SteadyClock::now();
  ASSERT_EQ(cudaMemcpyAsync(d.get(), src.get(), d.bytes(), cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(back.get(), d.get(), d.bytes(), cudaMemcpyDeviceToHost, s),
            cudaSuccess);
  EXPECT_LT(since(t0), 2s) << "a pinned copy waited for its stream";
  ASSERT_TRUE(gate.wait_reached());
  std::this_thread::sleep_for(kSettle);
  EXPECT_TRUE(all_equal(d.get(), kN, 0.f)) << "the copy ran before its stream reached it";
  EXPECT_TRUE(all_equal(back.get(), kN, 0.f));
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);

  gate.release();
  ASSERT_TRUE(wait_idle(s));
  EXPECT_TRUE(all_equal(d.get(), kN, 4.25f));
  EXPECT_TRUE(all_equal(back.get(), kN, 4.25f));
}

// ---- Several devices (RG_EMU_DEVICES=3, set by the ctest entry) ----

class StreamRuntimeDevices : public AsyncRuntimeTest {
 protected:
  static constexpr int kDevices = 3;
  void SetUp() override {
    int n = 0;
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
    ASSERT_GE(n, kDevices) << "run with RG_EMU_DEVICES=" << kDevices << " (ctest sets it)";
  }
};

TEST_F(StreamRuntimeDevices, TheCurrentDeviceIsPerHostThread) {
  OnDevice on(1);
  int device = -1;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 1);
  int seen_first = -1, seen_after = -1;
  std::thread([&] {
    (void)cudaGetDevice(&seen_first);  // a new thread starts on device 0
    (void)cudaSetDevice(2);
    (void)cudaGetDevice(&seen_after);
  }).join();
  EXPECT_EQ(seen_first, 0);
  EXPECT_EQ(seen_after, 2);
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 1) << "another thread's cudaSetDevice moved this one";

  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(cudaSetDevice(count), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 1);
}

TEST_F(StreamRuntimeDevices, MemoryIsTaggedWithItsDevice) {
  for (int d = 0; d < kDevices; ++d) {
    OnDevice on(d);
    DeviceBuffer buffer(kN);
    EXPECT_EQ(emu::memory_owner(buffer.get()), d);
    EXPECT_EQ(emu::memory_owner(buffer.get() + kN - 1), d);  // inside, not only the start
  }
  PinnedBuffer pinned(kN);
  EXPECT_EQ(emu::memory_owner(pinned.get()), -1);
  const std::vector<float> pageable(kN);
  EXPECT_EQ(emu::memory_owner(pageable.data()), -2);
}

TEST_F(StreamRuntimeDevices, AnEventCannotBeRecordedOnAnotherDevicesStream) {
  OnDevice on1(1);
  TestStream s1;
  TestEvent e1;
  EXPECT_EQ(emu::stream_device(s1), 1);
  {
    OnDevice on2(2);
    TestStream s2;
    EXPECT_EQ(emu::stream_device(s2), 2);
    EXPECT_EQ(emu::stream_name(s2).rfind("cuda:2/stream", 0), 0u) << emu::stream_name(s2);
    EXPECT_EQ(emu::stream_name(nullptr), "cuda:2/default");
    EXPECT_EQ(cudaEventRecord(e1, s2), cudaErrorInvalidResourceHandle);
    EXPECT_EQ(cudaEventRecord(e1, nullptr), cudaErrorInvalidResourceHandle);  // cuda:2's legacy
    (void)cudaGetLastError();
  }
  EXPECT_EQ(cudaEventRecord(e1, s1), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(e1, nullptr), cudaSuccess);
  EXPECT_TRUE(wait_reached(e1));
}

TEST_F(StreamRuntimeDevices, DevicesRunIndependently) {
  RG_REQUIRE_CONCURRENT_STREAMS();
  std::atomic<int> ran{0};
  StreamGate gate;
  {
    OnDevice on1(1);
    ASSERT_EQ(gate.hold(nullptr), cudaSuccess);  // cuda:1's legacy stream
    ASSERT_TRUE(gate.wait_reached());
  }
  {
    OnDevice on2(2);
    ASSERT_EQ(cudaLaunchHostFunc(nullptr, &count_call, &ran), cudaSuccess);
    EXPECT_TRUE(wait_idle(nullptr)) << "cuda:2's legacy stream waited for cuda:1's";
    const auto t0 = SteadyClock::now();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_LT(since(t0), 2s) << "cudaDeviceSynchronize on cuda:2 waited for cuda:1";
  }
  EXPECT_EQ(ran.load(), 1);
  EXPECT_FALSE(gate.passed());
  OnDevice on1(1);
  EXPECT_EQ(cudaStreamQuery(nullptr), cudaErrorNotReady);
  gate.release();
  EXPECT_TRUE(wait_idle(nullptr));
}

TEST_F(StreamRuntimeDevices, AStreamCanWaitForAnotherDevicesEvent) {
  std::atomic<int> ran{0};
  cudaStream_t s1 = nullptr, s2 = nullptr;
  cudaEvent_t e1 = nullptr;
  ScopeExit destroy([&] {
    (void)cudaStreamSynchronize(s2);
    (void)cudaStreamDestroy(s1);
    (void)cudaStreamDestroy(s2);
    (void)cudaEventDestroy(e1);
  });
  StreamGate gate;
  {
    OnDevice on1(1);
    ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
    ASSERT_EQ(gate.hold(s1), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(e1, s1), cudaSuccess);
  }
  OnDevice on2(2);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(s2, e1, 0), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(s2, &count_call, &ran), cudaSuccess);
  std::this_thread::sleep_for(kSettle);
  EXPECT_EQ(ran.load(), 0) << "cuda:2's stream ran past its wait for cuda:1's event";
  gate.release();
  EXPECT_TRUE(wait_idle(s2));
  EXPECT_EQ(ran.load(), 1);
}

// ---- Sticky errors (on cuda:2, reset at the end, so that no other test sees them) ----

TEST_F(StreamRuntimeDevices, AFailedHostFunctionIsAStickyErrorOfItsDevice) {
  constexpr int kFailing = 2;
  std::atomic<int> ran{0}, ran_elsewhere{0};
  ScopeExit reset([] {
    OnDevice on(kFailing);
    (void)cudaDeviceReset();
    (void)cudaGetLastError();
  });
  OnDevice on(kFailing);
  TestStream s;
  // Asynchronous like a kernel fault: the launch succeeds, the failure comes later.
  ASSERT_EQ(cudaLaunchHostFunc(s, &throw_from_host_function, nullptr), cudaSuccess);
  const cudaError_t status = cudaStreamSynchronize(s);
  EXPECT_EQ(status, cudaErrorLaunchFailure);
  const std::string msg = error_of(
      [&] { emu::check_status(status, "cudaStreamSynchronize(s)", "stream_runtime_test.cpp", 1); });
  EXPECT_NE(msg.find("unspecified launch failure"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cudaLaunchHostFunc"), std::string::npos) << "the failed op: " << msg;
  EXPECT_NE(msg.find("boom from the host function"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuda:2"), std::string::npos) << msg;

  // Sticky: every later call on the device reports it, and nothing more is queued there.
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaLaunchHostFunc(s, &count_call, &ran), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  {
    OnDevice other(0);  // other devices are unaffected
    ASSERT_EQ(cudaLaunchHostFunc(nullptr, &count_call, &ran_elsewhere), cudaSuccess);
    EXPECT_TRUE(wait_idle(nullptr));
    EXPECT_EQ(ran_elsewhere.load(), 1);
  }

  EXPECT_EQ(cudaDeviceReset(), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(s, &count_call, &ran), cudaSuccess);
  EXPECT_TRUE(wait_idle(s));
  EXPECT_EQ(ran.load(), 1) << "the launch refused during the error ran after all";
}

// ---- Launch blocking (CUDA_LAUNCH_BLOCKING=1) ----

TEST_F(StreamRuntimeDevices, LaunchBlockingMakesEveryLaunchWaitForItsWork) {
  std::atomic<int> ran{0};
  TestStream s;
  DeviceBuffer d(kN);
  {
    LaunchBlocking blocking(true);
    ASSERT_TRUE(emu::launch_blocking());
    ASSERT_EQ(cudaLaunchHostFunc(s, &sleep_then_count, &ran), cudaSuccess);
    EXPECT_EQ(ran.load(), 1) << "the launch returned before its work was done";
    EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
    set_value(d.get(), 9.f, kN, s);
    EXPECT_TRUE(all_equal(d.get(), kN, 9.f));
    ASSERT_EQ(cudaMemsetAsync(d.get(), 0, d.bytes(), s), cudaSuccess);
    EXPECT_TRUE(all_equal(d.get(), kN, 0.f));
    // A failure is thrown by the call that queued it instead of becoming a sticky error (on
    // cuda:1, reset in any case so that no other test sees it).
    ScopeExit reset([] {
      OnDevice on(1);
      (void)cudaDeviceReset();
      (void)cudaGetLastError();
    });
    OnDevice on(1);
    TestStream s1;
    const std::string msg = error_of([&] {
      emu::enqueue(s1, "a failing op", {}, [] { throw Error("boom from a queued op"); });
    });
    EXPECT_NE(msg.find("boom from a queued op"), std::string::npos) << msg;
    EXPECT_EQ(cudaStreamSynchronize(s1), cudaSuccess) << "the failure was left as sticky error";
  }
  {
    LaunchBlocking asynchronous(false);
    StreamGate gate;
    ASSERT_EQ(gate.hold(s), cudaSuccess);
    ASSERT_EQ(cudaLaunchHostFunc(s, &count_call, &ran), cudaSuccess);
    std::this_thread::sleep_for(kSettle);
    EXPECT_EQ(ran.load(), 1) << "still blocking after set_launch_blocking(false)";
    gate.release();
    EXPECT_TRUE(wait_idle(s));
    EXPECT_EQ(ran.load(), 2);
  }
}

// ---- Stream capture and graphs ----

class GraphCapture : public AsyncRuntimeTest {
 protected:
  void TearDown() override { (void)cudaGetLastError(); }
};

// Work queued on a capturing stream is recorded, not run; each launch of the graph runs all of
// it again, in order, on the stream it is launched on.
TEST_F(GraphCapture, CapturedWorkRunsOnlyAndEveryTimeTheGraphIsLaunched) {
  std::atomic<int> ran{0};
  TestStream s, other;
  DeviceBuffer d(kN), e(kN);
  PinnedBuffer out(kN);
  std::fill(out.get(), out.get() + kN, -1.f);
  ASSERT_EQ(cudaMemsetAsync(d.get(), 0, d.bytes(), s), cudaSuccess);
  ASSERT_TRUE(wait_idle(s));
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  scale(d.get(), e.get(), 3.f, kN, s);  // e = 3 d
  set_value(d.get(), 2.f, kN, s);       // then d = 2
  ASSERT_EQ(cudaLaunchHostFunc(s, &count_call, &ran), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out.get(), e.get(), e.bytes(), cudaMemcpyDeviceToHost, s), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_NE(graph, nullptr);
  ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(ran.load(), 0) << "captured work ran at capture";
  EXPECT_TRUE(all_equal(out.get(), kN, -1.f));
  EXPECT_TRUE(all_equal(d.get(), kN, 0.f));

  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);  // the executable keeps its own copy
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_TRUE(wait_idle(s));
  EXPECT_EQ(ran.load(), 1);
  EXPECT_TRUE(all_equal(out.get(), kN, 0.f)) << "first launch: e = 3 * 0";
  // Again, on another stream: d is 2 now, so e = 6.
  ASSERT_EQ(cudaGraphLaunch(exec, other), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, other), cudaSuccess);
  ASSERT_TRUE(wait_idle(other));
  EXPECT_EQ(ran.load(), 3);
  EXPECT_TRUE(all_equal(out.get(), kN, 6.f)) << "out[0] = " << out.get()[0];
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphLaunch(exec, s), cudaErrorInvalidValue);
}

// What would make the host wait for a capturing stream cannot be captured: it invalidates the
// capture, whose end then fails; the stream works normally afterwards.
TEST_F(GraphCapture, SynchronizingOrQueryingACapturingStreamInvalidatesTheCapture) {
  std::atomic<int> ran{0};
  TestStream s;
  std::vector<float> pageable(kN);
  DeviceBuffer d(1);
  for (int how = 0; how < 3; ++how) {
    SCOPED_TRACE(how);
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    ASSERT_EQ(cudaLaunchHostFunc(s, &count_call, &ran), cudaSuccess);
    const cudaError_t e = how == 0   ? cudaStreamSynchronize(s)
                          : how == 1 ? cudaStreamQuery(s)
                                     : cudaMemcpyAsync(pageable.data(), d.get(), sizeof(float),
                                                       cudaMemcpyDeviceToHost, s);
    EXPECT_EQ(e, cudaErrorStreamCaptureUnsupported);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(1);
    EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(graph, nullptr);
  }
  ASSERT_EQ(cudaLaunchHostFunc(s, &count_call, &ran), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ran.load(), 1) << "only the host function queued after the captures ran";
}

// cudaMalloc (and cudaFree, device synchronization) during a global-mode capture invalidate it,
// as CUDA's "unsafe" calls; a relaxed-mode capture allows cudaMalloc.
TEST_F(GraphCapture, AllocatingDuringAGlobalCaptureInvalidatesItButNotARelaxedOne) {
  TestStream s;
  for (cudaStreamCaptureMode mode : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeRelaxed}) {
    ASSERT_EQ(cudaStreamBeginCapture(s, mode), cudaSuccess);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, 64);
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(s, &graph);
    if (mode == cudaStreamCaptureModeGlobal) {
      EXPECT_EQ(e, cudaErrorStreamCaptureUnsupported);
      EXPECT_EQ(end, cudaErrorStreamCaptureInvalidated);
    } else {
      EXPECT_EQ(e, cudaSuccess);
      EXPECT_EQ(end, cudaSuccess);
      EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
      EXPECT_EQ(cudaFree(p), cudaSuccess);
    }
  }
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  // A thread that switches itself to relaxed mode may allocate during its thread-local capture
  // (the caching allocator's graph pools grow so); freeing still invalidates it.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeGlobal) << "a thread starts in global mode";
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeRelaxed);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorStreamCaptureUnsupported);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  mode = static_cast<cudaStreamCaptureMode>(7);
  EXPECT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

// Waiting for work outside the capture (an event, another stream), querying another stream and
// unpinning host memory are unsafe during a capture, as cudaEventQuery and cudaFree: refused on
// the thread of a thread-local capture and on every thread during a global one, and the capture is
// invalidated. Another thread may make them during a thread-local capture.
TEST_F(GraphCapture, WaitingForOtherWorkOrUnpinningDuringACaptureInvalidatesIt) {
  TestStream s, other;
  TestEvent done;
  ASSERT_EQ(cudaEventRecord(done, other), cudaSuccess);
  for (int how = 0; how < 4; ++how) {
    for (const cudaStreamCaptureMode mode :
         {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal}) {
      for (const bool own_thread : {true, false}) {
        SCOPED_TRACE(
            ::rg::detail::cat("call ", how, ", mode ", int(mode), ", own thread ", own_thread));
        void* pinned = nullptr;
        ASSERT_EQ(cudaHostAlloc(&pinned, 64, 0), cudaSuccess);
        ASSERT_EQ(cudaStreamBeginCapture(s, mode), cudaSuccess);
        cudaError_t e = cudaErrorInvalidValue;  // (not a result here)
        auto call = [&] {
          e = how == 0   ? cudaEventSynchronize(done)
              : how == 1 ? cudaStreamSynchronize(other)
              : how == 2 ? cudaStreamQuery(other)
                         : cudaFreeHost(pinned);
          (void)cudaGetLastError();
        };
        if (own_thread)
          call();
        else
          std::thread(call).join();
        cudaGraph_t graph = nullptr;
        const cudaError_t end = cudaStreamEndCapture(s, &graph);
        (void)cudaGetLastError();
        const bool refused = own_thread || mode == cudaStreamCaptureModeGlobal;
        EXPECT_EQ(e, refused ? cudaErrorStreamCaptureUnsupported : cudaSuccess);
        EXPECT_EQ(end, refused ? cudaErrorStreamCaptureInvalidated : cudaSuccess);
        if (graph != nullptr) {
          EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
        }
        if (how != 3 || refused) {
          EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
        }
      }
    }
  }
}

// After an unsafe call invalidated a capture, every later call into it fails, as in CUDA: a
// kernel launch (an rg::Error naming cudaErrorStreamCaptureInvalidated), a copy, a memset, an
// event record, a stream wait, a host function and another stream's join through an event
// recorded in it, until cudaStreamEndCapture ends it; none of that work runs.
TEST_F(GraphCapture, EveryCallIntoAnInvalidatedCaptureFailsUntilItsEnd) {
  std::atomic<int> ran{0};
  TestStream s, other;
  TestEvent e, fork;
  DeviceBuffer d(kN), f(kN);
  set_value(d.get(), 1.f, kN, s);
  ASSERT_TRUE(wait_idle(s));
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  set_value(d.get(), 2.f, kN, s);  // captured
  ASSERT_EQ(cudaEventRecord(fork, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(other), cudaErrorStreamCaptureUnsupported);
  ASSERT_EQ(cudaGetLastError(), cudaErrorStreamCaptureUnsupported);
  const std::string msg = error_of([&] { set_value(d.get(), 3.f, kN, s); });
  EXPECT_NE(msg.find("cudaErrorStreamCaptureInvalidated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("operation not permitted when stream is capturing"), std::string::npos)
      << msg << " (the call that invalidated it)";
  EXPECT_EQ(cudaMemcpyAsync(f.get(), d.get(), d.bytes(), cudaMemcpyDeviceToDevice, s),
            cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaMemsetAsync(d.get(), 0, d.bytes(), s), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaEventRecord(e, s), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaStreamWaitEvent(s, e), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaLaunchHostFunc(s, &count_call, &ran), cudaErrorStreamCaptureInvalidated);
  // Another stream cannot join it either.
  EXPECT_EQ(cudaStreamWaitEvent(other, fork), cudaErrorStreamCaptureInvalidated);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  ASSERT_EQ(cudaStreamIsCapturing(other, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(1);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  (void)cudaGetLastError();
  // The stream works normally afterwards; nothing of the capture ran.
  ASSERT_EQ(cudaLaunchHostFunc(s, &count_call, &ran), cudaSuccess);
  ASSERT_TRUE(wait_idle(s));
  EXPECT_EQ(ran.load(), 1);
  EXPECT_TRUE(all_equal(d.get(), kN, 1.f)) << "d[0] = " << d.get()[0];
}

// An event recorded in a capture orders work inside it and cannot be queried; waiting in a
// capture for an event recorded outside it is an isolation error; the legacy stream cannot be
// captured; a capture cannot begin twice.
TEST_F(GraphCapture, EventsAcrossTheCaptureBoundaryAreRefused) {
  TestStream s, other;
  TestEvent inside, outside;
  ASSERT_EQ(cudaEventRecord(outside, other), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
  ASSERT_EQ(cudaEventRecord(inside, s), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(s, inside), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(inside), cudaErrorCapturedEvent);
  EXPECT_EQ(cudaEventSynchronize(inside), cudaErrorCapturedEvent);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(s, outside), cudaErrorStreamCaptureIsolation);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal),
            cudaErrorStreamCaptureUnsupported);
  // Recorded again outside a capture, the event is an ordinary one.
  ASSERT_EQ(cudaEventRecord(inside, s), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(inside), cudaSuccess);
}

// Another stream joins a capture by waiting on an event recorded in it (a fork): its work is
// recorded into the same graph, in the order the host queued it, and the capturing stream must
// wait on an event recorded after that work (a join) before the capture ends. An unjoined fork,
// ending the capture on the joined stream, or synchronizing the joined stream fail as in CUDA.
TEST_F(GraphCapture, AnotherStreamJoinsACaptureThroughAnEventAndMustJoinBack) {
  TestStream s, side;
  TestEvent fork, join;
  DeviceBuffer d(kN), e(kN), f(kN);
  set_value(f.get(), -1.f, kN, s);
  ASSERT_TRUE(wait_idle(s));
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  set_value(d.get(), 1.f, kN, s);
  ASSERT_EQ(cudaEventRecord(fork, s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(side, fork), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(side, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive) << "the waiting stream joined the capture";
  scale(d.get(), e.get(), 3.f, kN, side);  // e = 3 d, on the joined stream
  ASSERT_EQ(cudaEventRecord(join, side), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(s, join), cudaSuccess);
  scale(e.get(), f.get(), 2.f, kN, s);  // f = 2 e
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_EQ(cudaStreamIsCapturing(side, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone) << "the capture ended on the joined stream too";
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(all_equal(f.get(), kN, -1.f)) << "captured work ran at capture";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_TRUE(wait_idle(s));
  EXPECT_TRUE(all_equal(f.get(), kN, 6.f)) << "f[0] = " << f.get()[0];
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);

  // Forked and never joined back: EndCapture fails, and the capture is over on both streams.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork, s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(side, fork), cudaSuccess);
  set_value(d.get(), 5.f, kN, side);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureUnjoined);
  EXPECT_EQ(graph, nullptr);
  // The failed call's error stays the thread's last error (the next RG_LAUNCH would report it)
  // until cudaGetLastError takes it.
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorStreamCaptureUnjoined);
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureUnjoined);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaStreamIsCapturing(side, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  // Joined back only up to before its last work: still unjoined.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork, s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(side, fork), cudaSuccess);
  set_value(d.get(), 5.f, kN, side);
  ASSERT_EQ(cudaEventRecord(join, side), cudaSuccess);
  set_value(d.get(), 6.f, kN, side);
  ASSERT_EQ(cudaStreamWaitEvent(s, join), cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureUnjoined);
  // Ended on the joined stream: unmatched, and the capture is invalidated.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork, s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(side, fork), cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(side, &graph), cudaErrorStreamCaptureUnmatched);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  // Synchronizing the joined stream invalidates the capture, as the capturing one's would.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork, s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(side, fork), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(side), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
  // Both streams work normally afterwards; nothing of the failed captures ran.
  ASSERT_TRUE(wait_idle(side));
  EXPECT_TRUE(all_equal(d.get(), kN, 1.f)) << "d[0] = " << d.get()[0];
}

}  // namespace
}  // namespace rg::emu_runtime_test
