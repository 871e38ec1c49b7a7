// Helpers for the tests of the emulated runtime: a host function that holds a stream until the test
// releases it, bounded waits (a wrong runtime fails a test instead of hanging it), and owners of
// streams, events and buffers that clean up after a failed assertion.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "kernels/emu/device_runtime.h"
#include "kernels/emu/runtime_api.h"

namespace rg::emu_runtime_test {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

// Holds the stream it is queued on: its host function blocks that stream's worker until release()
// (or the destructor), and lets go by itself after `limit` so that no test can hang on it. Queue
// it at most once; never in launch-blocking mode (the host itself would wait there).
class StreamGate {
 public:
  explicit StreamGate(std::chrono::milliseconds limit = 10s) : state_(std::make_shared<State>()) {
    state_->limit = limit;
  }
  ~StreamGate() { release(); }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  cudaError_t hold(cudaStream_t stream) {
    // The host function owns a reference: the state outlives the gate if the stream lags.
    auto* arg = new std::shared_ptr<State>(state_);
    const cudaError_t status = cudaLaunchHostFunc(stream, &StreamGate::run, arg);
    if (status != cudaSuccess) delete arg;
    return status;
  }
  void release() {
    std::lock_guard lock(state_->mu);
    state_->open = true;
    state_->cv.notify_all();
  }
  // The stream's worker is inside the gate (waits up to `timeout` for it to get there).
  bool wait_reached(std::chrono::milliseconds timeout = 5s) const {
    std::unique_lock lock(state_->mu);
    return state_->cv.wait_for(lock, timeout, [&] { return state_->reached; });
  }
  // The gate's host function has returned.
  bool passed() const {
    std::lock_guard lock(state_->mu);
    return state_->passed;
  }
  // It returned at its deadline, without release(): whatever the test expected did not happen.
  bool timed_out() const {
    std::lock_guard lock(state_->mu);
    return state_->timed_out;
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::chrono::milliseconds limit{0};
    bool open = false, reached = false, passed = false, timed_out = false;
  };
  static void run(void* p) {
    const std::unique_ptr<std::shared_ptr<State>> arg(static_cast<std::shared_ptr<State>*>(p));
    State& s = **arg;
    std::unique_lock lock(s.mu);
    s.reached = true;
    s.cv.notify_all();
    if (!s.cv.wait_for(lock, s.limit, [&] { return s.open; })) s.timed_out = true;
    s.passed = true;
    s.cv.notify_all();
  }
  std::shared_ptr<State> state_;
};

// A bounded cudaStreamSynchronize: polls until the stream has no pending work (true) or `timeout`
// passes (false). A successful query orders the host after the stream, as a synchronize does.
inline bool wait_idle(cudaStream_t stream, std::chrono::milliseconds timeout = 5s) {
  const auto deadline = SteadyClock::now() + timeout;
  for (;;) {
    const cudaError_t status = cudaStreamQuery(stream);
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady || SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
}

// A bounded cudaEventSynchronize, the same way.
inline bool wait_reached(cudaEvent_t event, std::chrono::milliseconds timeout = 5s) {
  const auto deadline = SteadyClock::now() + timeout;
  for (;;) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady || SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
}

// How long the tests give a wrong runtime to show itself before checking that something has not
// happened yet (a correct one cannot get past a held gate however long we wait).
inline constexpr std::chrono::milliseconds kSettle = 50ms;

// Polls `done` until it holds (true) or `timeout` passes (false).
template <class Pred>
bool eventually(Pred done, std::chrono::milliseconds timeout = 5s) {
  const auto deadline = SteadyClock::now() + timeout;
  while (!done()) {
    if (SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Runs a callable when the scope ends (releases, restores, destroys), even after a failed ASSERT.
template <class F>
class ScopeExit {
 public:
  explicit ScopeExit(F f) : f_(std::move(f)) {}
  ~ScopeExit() { f_(); }
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;

 private:
  F f_;
};

// A stream of the current device. Its destructor waits for the stream's work (declare gates after
// the streams they hold, so that they are released first) and destroys it; declare whatever that
// work touches before the stream.
class TestStream {
 public:
  // blocking: created by cudaStreamCreate, so it is ordered with the legacy default stream.
  explicit TestStream(bool blocking = false) {
    EXPECT_EQ(
        blocking ? cudaStreamCreate(&s_) : cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking),
        cudaSuccess);
  }
  ~TestStream() {
    if (s_ == nullptr) return;
    (void)cudaStreamSynchronize(s_);
    (void)cudaStreamDestroy(s_);
    (void)cudaGetLastError();
  }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  operator cudaStream_t() const { return s_; }  // NOLINT: used where a cudaStream_t is

 private:
  cudaStream_t s_ = nullptr;
};

class TestEvent {
 public:
  explicit TestEvent(unsigned int flags = cudaEventDefault) {
    EXPECT_EQ(cudaEventCreateWithFlags(&e_, flags), cudaSuccess);
  }
  ~TestEvent() {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
  }
  TestEvent(const TestEvent&) = delete;
  TestEvent& operator=(const TestEvent&) = delete;
  operator cudaEvent_t() const { return e_; }  // NOLINT

 private:
  cudaEvent_t e_ = nullptr;
};

// n floats of device memory of the current device (cudaMalloc), or of pinned host memory
// (cudaHostAlloc). Freeing waits for all queued work, as in CUDA.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(float)), cudaSuccess);
  }
  ~DeviceBuffer() { (void)cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* get() const { return p_; }
  size_t bytes() const { return n_ * sizeof(float); }

 private:
  size_t n_;
  float* p_ = nullptr;
};

class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t n) : n_(n) {
    EXPECT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&p_), n * sizeof(float), cudaHostAllocDefault),
              cudaSuccess);
  }
  ~PinnedBuffer() { (void)cudaFreeHost(p_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  float* get() const { return p_; }
  size_t bytes() const { return n_ * sizeof(float); }

 private:
  size_t n_;
  float* p_ = nullptr;
};

// Makes `device` the calling thread's current device for a scope.
class OnDevice {
 public:
  explicit OnDevice(int device) {
    EXPECT_EQ(cudaGetDevice(&previous_), cudaSuccess);
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  }
  ~OnDevice() { (void)cudaSetDevice(previous_); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_ = 0;
};

// Sets launch blocking (rg::emu::set_launch_blocking) for a scope and restores it.
class LaunchBlocking {
 public:
  explicit LaunchBlocking(bool on) : previous_(emu::launch_blocking()) {
    emu::set_launch_blocking(on);
  }
  ~LaunchBlocking() { emu::set_launch_blocking(previous_); }
  LaunchBlocking(const LaunchBlocking&) = delete;
  LaunchBlocking& operator=(const LaunchBlocking&) = delete;

 private:
  bool previous_;
};

// Tests of asynchronous behaviour run asynchronously even under CUDA_LAUNCH_BLOCKING=1, which
// would otherwise make every gate block the host (and order away every race).
class AsyncRuntimeTest : public ::testing::Test {
 private:
  LaunchBlocking asynchronous_{false};
};

// For tests that need streams to run concurrently, which RG_EMU_SERIALIZE=1 (one worker for all
// streams, a debugging mode) rules out by design.
#define RG_REQUIRE_CONCURRENT_STREAMS()                                                     \
  do {                                                                                      \
    if (::rg::emu::serialize_mode()) {                                                      \
      GTEST_SKIP() << "RG_EMU_SERIALIZE=1 runs every stream on one worker: no concurrency"; \
    }                                                                                       \
  } while (0)

}  // namespace rg::emu_runtime_test
