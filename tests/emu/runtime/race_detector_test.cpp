// The emulator's stream-race detector through the engine (Tensor, Stream, Event, record_stream) and
// the runtime API: each correct ordering pattern gives no report, and each mutation of it (a
// removed event wait, record_stream or synchronization) is reported naming both operations and
// streams.
#include <gtest/gtest.h>

#include <chrono>

#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "emu/runtime/runtime_kernels.h"
#include "emu/runtime/runtime_test_util.h"
#include "engine/cuda/device_guard.h"
#include "engine/cuda/event.h"
#include "engine/cuda/memory.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/stream.h"
#include "engine/ops/binary.h"
#include "engine/tensor.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/emu/runtime_api.h"
#include "kernels/error.h"
#include "support/errors.h"

namespace rg {
namespace {

using ::rg::emu_runtime_test::AsyncRuntimeTest;
using ::rg::emu_runtime_test::DeviceBuffer;
using ::rg::emu_runtime_test::PinnedBuffer;
using ::rg::emu_runtime_test::StreamGate;
using ::rg::emu_runtime_test::TestStream;
using ::rg::testing::error_of;

constexpr int64_t kN = 1024;  // 4 KiB of f32: a block of its own in the small pool
const Device kCuda0 = Device::cuda(0);

Tensor filled(int64_t n, double value) {
  Tensor t = Tensor::empty({n}, DType::f32, kCuda0);
  t.fill_(value);
  return t;
}

std::vector<float> values(int64_t n, float v) { return std::vector<float>(size_t(n), v); }

// The runtime's name of a stream, as race reports spell it ("cuda:0/stream 7").
std::string name_of(cudaStream_t s) { return emu::stream_name(s); }
std::string name_of(const cuda::Stream& s) {
  return name_of(static_cast<cudaStream_t>(s.handle()));
}

std::string joined(const std::vector<std::string>& reports) {
  std::string all;
  for (const std::string& r : reports) all += "\n  " + r;
  return all;
}

// A race report: "stream race", and every fragment (operations and streams).
void expect_report(const std::string& report, std::initializer_list<std::string> fragments) {
  ASSERT_FALSE(report.empty()) << "no race was reported";
  EXPECT_NE(report.find("stream race"), std::string::npos) << report;
  for (const std::string& f : fragments) {
    EXPECT_NE(report.find(f), std::string::npos) << "'" << f << "' is missing from: " << report;
  }
}

class RaceDetector : public AsyncRuntimeTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(emu::racecheck_enabled()) << "RG_EMU_RACECHECK=off: these tests need it on";
    ASSERT_GE(cuda::runtime().device_count(), 1);
    // Earlier tests' work (same process) is ordered before this test's.
    cuda::synchronize(0);
    emu::clear_race_reports();
  }
  static void expect_no_reports() {
    const std::vector<std::string> reports = emu::race_reports();
    EXPECT_TRUE(reports.empty()) << joined(reports);
  }
  // Where a mutation test ends: the host waits for all work (so that what the test used is freed
  // in order) and drops the reports it expected.
  static void settle_and_clear() {
    cuda::synchronize(0);
    emu::clear_race_reports();
  }
};

// ---- Producer and consumer on two streams ----

TEST_F(RaceDetector, AnEventOrdersAProducerAndAConsumerOnTwoStreams) {
  const cuda::Stream producer = cuda::pooled_stream(0), consumer = cuda::pooled_stream(0);
  ASSERT_FALSE(producer == consumer);
  {
    Tensor x;
    {
      cuda::StreamGuard on(producer);
      x = filled(kN, 2.0);  // allocated for and written on the producer stream
    }
    cuda::Event produced;
    produced.record(producer);
    consumer.wait(produced);
    cuda::StreamGuard on(consumer);
    const Tensor y = mul(x, 3.0);      // reads x
    cuda::record_stream(x, consumer);  // x goes back to the producer's pool after this use
    EXPECT_EQ(y.to_vector<float>(), values(kN, 6.f));
  }
  expect_no_reports();
}

TEST_F(RaceDetector, AConsumerThatDoesNotWaitForTheProducerIsReportedAtItsLaunch) {
  const cuda::Stream producer = cuda::pooled_stream(0), consumer = cuda::pooled_stream(0);
  Tensor x;
  {
    cuda::StreamGuard on(producer);
    x = filled(kN, 2.0);
  }
  std::string msg;
  {
    cuda::StreamGuard on(consumer);
    EXPECT_THROW(
        {
          try {
            (void)mul(x, 3.0);  // no wait for the producer's event
          } catch (const Error& e) {
            msg = e.what();
            throw;
          }
        },
        Error);
  }
  expect_report(msg, {"binary_scalar_kernel", "on " + name_of(consumer) + " reads", "fill_kernel",
                      "on " + name_of(producer) + " writes", "cuda:0/stream"});
  EXPECT_EQ(emu::race_reports(), std::vector<std::string>{msg});
  settle_and_clear();
}

// The allocators poll the events of pending frees on the program's own thread. A poll that finds
// the producer's work done must not count as the host waiting for it, or every later launch
// would look ordered after the producer and a missing wait would go unseen whenever the poll
// happened to come late enough.
TEST_F(RaceDetector, AnAllocatorPollThatSeesTheProducerDoneDoesNotHideAMissingWait) {
  const cuda::Stream producer = cuda::pooled_stream(0), consumer = cuda::pooled_stream(0);
  Tensor x;
  {
    cuda::StreamGuard on(producer);
    x = filled(kN, 2.0);
  }
  {
    // A default-stream block also used by the producer: its free waits for an event recorded on
    // the producer after x's fill.
    Tensor scratch = filled(kN, 1.0);
    cuda::record_stream(scratch, producer);
  }
  cuda::Event done;
  done.record(producer);
  while (!done.poll()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // This allocation processes the pending free: the allocator's poll finds the producer done.
  const Tensor other = filled(kN, 0.0);
  EXPECT_EQ(cuda::memory_stats(0).pending_free_blocks, 0);
  std::string msg;
  {
    cuda::StreamGuard on(consumer);
    msg = error_of([&] { (void)mul(x, 3.0); });  // still no wait for the producer
  }
  expect_report(msg, {"binary_scalar_kernel", "on " + name_of(consumer) + " reads", "fill_kernel",
                      "on " + name_of(producer) + " writes"});
  settle_and_clear();
}

// ---- Write after read ----

// The default stream fills x, a side stream reads it (after waiting for the fill), then the
// default stream overwrites x, after waiting for the side stream when `ordered`. Returns the error
// of the overwrite ("" when none).
std::string overwrite_after_read(bool ordered) {
  const cuda::Stream main = cuda::current_stream(0), side = cuda::pooled_stream(0);
  EXPECT_TRUE(main.is_default());
  Tensor x = filled(kN, 1.0);
  side.wait(main);
  Tensor y;
  {
    cuda::StreamGuard on(side);
    y = mul(x, 2.0);
  }
  if (ordered) main.wait(side);
  const std::string msg = error_of([&] { x.fill_(3.0); });
  if (msg.empty()) {
    EXPECT_EQ(x.to_vector<float>(), values(kN, 3.f));
    cuda::StreamGuard on(side);
    EXPECT_EQ(y.to_vector<float>(), values(kN, 2.f));
  } else {
    cuda::synchronize(0);  // x is freed in order
  }
  return msg;
}

TEST_F(RaceDetector, AnOverwriteOrderedAfterAReadOnAnotherStreamIsNotReported) {
  EXPECT_EQ(overwrite_after_read(/*ordered=*/true), "");
  expect_no_reports();
}

TEST_F(RaceDetector, AnOverwriteUnorderedWithAReadOnAnotherStreamIsReported) {
  const std::string msg = overwrite_after_read(/*ordered=*/false);
  expect_report(msg, {"kernel fill_kernel", "on cuda:0/default writes", "binary_scalar_kernel",
                      "cuda:0/stream", " reads with no ordering"});
  EXPECT_EQ(emu::race_reports(), std::vector<std::string>{msg});
  settle_and_clear();
}

// ---- Concurrent reads ----

TEST_F(RaceDetector, ReadsOnTwoStreamsNeedNoOrdering) {
  const cuda::Stream side = cuda::pooled_stream(0);
  {
    const Tensor x = filled(kN, 1.0);
    side.wait(cuda::current_stream(0));  // both reads come after the fill
    Tensor on_side;
    {
      cuda::StreamGuard on(side);
      on_side = mul(x, 2.0);
      cuda::record_stream(x, side);
    }
    const Tensor on_default = mul(x, 3.0);  // unordered with the side stream's read
    EXPECT_EQ(on_default.to_vector<float>(), values(kN, 3.f));
    cuda::StreamGuard on(side);
    EXPECT_EQ(on_side.to_vector<float>(), values(kN, 2.f));
  }
  expect_no_reports();
}

// ---- The record_stream contract ----

struct FreeResult {
  std::vector<std::string> reports_at_free;
  std::string next_launch_error;
};

// x, allocated on the default stream, is updated on a side stream and freed by the default
// stream, which never waits for the side stream; then a tensor of the same size is allocated
// (x's block, when the allocator hands it out at once) and written on the default stream.
FreeResult free_after_use_on_a_side_stream(bool record_stream) {
  const cuda::Stream side = cuda::pooled_stream(0);
  FreeResult result;
  {
    Tensor x = filled(kN, 1.0);
    side.wait(cuda::current_stream(0));
    {
      cuda::StreamGuard on(side);
      mul_(x, 2.0);
    }
    if (record_stream) cuda::record_stream(x, side);
  }
  result.reports_at_free = emu::race_reports();
  Tensor next = Tensor::empty({kN}, DType::f32, kCuda0);
  result.next_launch_error = error_of([&] { next.fill_(5.0); });
  if (result.next_launch_error.empty()) {
    EXPECT_EQ(next.to_vector<float>(), values(kN, 5.f));
  }
  return result;
}

TEST_F(RaceDetector, AFreeAfterRecordStreamIsNotReported) {
  const FreeResult r = free_after_use_on_a_side_stream(/*record_stream=*/true);
  EXPECT_TRUE(r.reports_at_free.empty()) << joined(r.reports_at_free);
  EXPECT_EQ(r.next_launch_error, "");
  expect_no_reports();
}

TEST_F(RaceDetector, AFreeWithoutRecordStreamIsReportedAndThrownByTheNextLaunch) {
  const FreeResult r = free_after_use_on_a_side_stream(/*record_stream=*/false);
  ASSERT_EQ(r.reports_at_free.size(), 1u) << joined(r.reports_at_free);
  const std::string& report = r.reports_at_free.front();
  expect_report(report, {"was freed by cuda:0/default", "binary_scalar_kernel", "cuda:0/stream",
                         "may still write it", "record_stream"});
  // Found where nothing can throw (a destructor): the next call that queues work throws it.
  EXPECT_EQ(r.next_launch_error, report);
  settle_and_clear();
}

// ---- Pinned memory and asynchronous copies ----

TEST_F(RaceDetector, APinnedSourceIsNotReusedBeforeItsAsyncCopyIsDone) {
  Tensor d;
  {
    StreamGate gate;  // holds the default stream: the copy cannot have run before the free
    ASSERT_EQ(gate.hold(nullptr), cudaSuccess);
    Tensor p = Tensor::empty_pinned({kN});
    p.fill_(1.5);
    d = p.to(kCuda0, /*non_blocking=*/true);  // records the copy's stream for p's block
    p = Tensor();
    // Had the allocator handed p's block out again, this host write would reach the copy.
    Tensor q = Tensor::empty_pinned({kN});
    q.fill_(-1.0);
    gate.release();
  }
  EXPECT_EQ(d.to_vector<float>(), values(kN, 1.5f));
  expect_no_reports();
}

TEST_F(RaceDetector, APinnedDestinationIsNotReusedBeforeItsAsyncCopyIsDone) {
  const Tensor d = filled(kN, 2.5);
  Tensor q;
  {
    StreamGate gate;
    ASSERT_EQ(gate.hold(nullptr), cudaSuccess);
    Tensor p = Tensor::empty_pinned({kN});
    p.copy_(d, /*non_blocking=*/true);  // queued behind the gate; records the stream for p
    p = Tensor();
    q = Tensor::empty_pinned({kN});
    q.fill_(-1.0);
    gate.release();
  }
  cuda::current_stream(0).synchronize();
  EXPECT_EQ(q.to_vector<float>(), values(kN, -1.f)) << "the copy wrote into a reused block";
  expect_no_reports();
}

TEST_F(RaceDetector, FreeingAPinnedBufferBeforeItsCopyIsKnownToBeDoneIsReported) {
  Tensor d = Tensor::empty({kN}, DType::f32, kCuda0);
  Tensor p = Tensor::empty_pinned({kN});
  p.fill_(1.5);
  // The copy that Tensor::to(non_blocking) makes, without its record_stream, and no synchronize.
  ASSERT_EQ(cudaMemcpyAsync(d.raw_data(), p.raw_data(), d.nbytes(), cudaMemcpyHostToDevice,
                            static_cast<cudaStream_t>(cuda::current_stream(0).handle())),
            cudaSuccess);
  p = Tensor();
  const std::vector<std::string> reports = emu::race_reports();
  ASSERT_EQ(reports.size(), 1u) << joined(reports);
  expect_report(reports.front(),
                {"pinned host memory", "was freed by the host",
                 "cudaMemcpyAsync of " + std::to_string(d.nbytes()) + " bytes on cuda:0/default",
                 "may still read it"});
  EXPECT_EQ(error_of([&] { d.fill_(0.0); }), reports.front());
  settle_and_clear();
}

// ---- DDP's bucket path ----

struct BucketRun {
  std::string error;
  std::vector<float> p1, p2;
};

// Gradients are views of one flat bucket, written on the default stream (backward); a
// communication stream reduces the bucket (here: halves it) after waiting for them; the default
// stream waits for the reduction before the optimizer reads the gradients.
BucketRun bucket_step(bool wait_for_gradients, bool wait_for_reduction) {
  constexpr int64_t kN1 = 300, kN2 = 500;
  const cuda::Stream main = cuda::current_stream(0), comm = cuda::pooled_stream(0);
  BucketRun run;
  Tensor p1 = filled(kN1, 1.0), p2 = filled(kN2, 1.0);
  Tensor bucket = Tensor::empty({kN1 + kN2}, DType::f32, kCuda0);
  Tensor g1 = bucket.flat_narrow(0, kN1), g2 = bucket.flat_narrow(kN1, kN2);
  g1.fill_(2.0);
  g2.fill_(4.0);
  cuda::Event ready;
  ready.record(main);
  if (wait_for_gradients) comm.wait(ready);
  run.error = error_of([&] {
    {
      cuda::StreamGuard on(comm);
      mul_(bucket, 0.5);  // the all-reduce
    }
    cuda::Event reduced;
    reduced.record(comm);
    if (wait_for_reduction) main.wait(reduced);
    add_(p1, g1, -0.1);  // the optimizer step
    add_(p2, g2, -0.1);
  });
  if (run.error.empty()) {
    run.p1 = p1.to_vector<float>();
    run.p2 = p2.to_vector<float>();
  } else {
    cuda::synchronize(0);
  }
  return run;
}

TEST_F(RaceDetector, TheBucketPathWithBothWaitsIsNotReported) {
  const BucketRun run = bucket_step(true, true);
  EXPECT_EQ(run.error, "");
  EXPECT_EQ(run.p1, values(300, 1.f - 0.1f * 1.f));
  EXPECT_EQ(run.p2, values(500, 1.f - 0.1f * 2.f));
  expect_no_reports();
}

TEST_F(RaceDetector, AReductionThatDoesNotWaitForTheGradientsIsReported) {
  const BucketRun run = bucket_step(/*wait_for_gradients=*/false, /*wait_for_reduction=*/true);
  expect_report(run.error, {"binary_scalar_kernel", "fill_kernel", "on cuda:0/default writes",
                            "cuda:0/stream"});
  const std::vector<std::string> reports = emu::race_reports();
  ASSERT_FALSE(reports.empty());
  for (const std::string& r : reports) {
    expect_report(r, {"binary_scalar_kernel", "cuda:0/stream", "fill_kernel", "cuda:0/default"});
  }
  settle_and_clear();
}

TEST_F(RaceDetector, AnOptimizerThatDoesNotWaitForTheReductionIsReported) {
  const BucketRun run = bucket_step(/*wait_for_gradients=*/true, /*wait_for_reduction=*/false);
  expect_report(run.error, {"axpy_kernel", "on cuda:0/default reads", "binary_scalar_kernel",
                            "cuda:0/stream", " writes with no ordering"});
  EXPECT_EQ(emu::race_reports(), std::vector<std::string>{run.error});
  settle_and_clear();
}

// ---- The runtime API: what each operation is seen to touch ----

TEST_F(RaceDetector, AKernelReadsThroughConstPointersAndWritesThroughTheOthers) {
  constexpr int n = 256;
  TestStream a, b;
  DeviceBuffer d(n), out_a(n), out_b(n);
  ASSERT_EQ(cudaMemset(d.get(), 0, d.bytes()), cudaSuccess);  // the host waits: ordered
  emu_runtime_test::scale(d.get(), out_a.get(), 2.f, n, a);
  emu_runtime_test::scale(d.get(), out_b.get(), 3.f, n, b);  // two reads: no ordering needed
  expect_no_reports();
  const std::string msg = error_of([&] { emu_runtime_test::set_value(d.get(), 1.f, n, b); });
  expect_report(msg, {"kernel set_value_kernel on " + name_of(b) + " writes",
                      "kernel scale_kernel on " + name_of(a) + " reads"});
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  emu::clear_race_reports();
}

TEST_F(RaceDetector, CopiesTouchTheirRangeAndAKernelPointerReachesTheEndOfItsAllocation) {
  constexpr int n = 256;
  TestStream a, b;
  PinnedBuffer src(2 * n);
  DeviceBuffer d(2 * n);
  const size_t half = n * sizeof(float);
  // Two halves of one allocation, each copied on its own stream: disjoint, so no race.
  ASSERT_EQ(cudaMemcpyAsync(d.get(), src.get(), half, cudaMemcpyHostToDevice, a), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d.get() + n, src.get() + n, half, cudaMemcpyHostToDevice, b),
            cudaSuccess);
  expect_no_reports();
  // A kernel writing the first half: the launch does not say its extent, so the detector takes
  // the rest of the allocation, which b's copy writes (the documented conservative extent).
  const std::string msg = error_of([&] { emu_runtime_test::set_value(d.get(), 1.f, n, a); });
  expect_report(
      msg, {"kernel set_value_kernel on " + name_of(a) + " writes",
            "cudaMemcpyAsync of " + std::to_string(half) + " bytes on " + name_of(b) + " writes"});
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  emu::clear_race_reports();
}

}  // namespace
}  // namespace rg
