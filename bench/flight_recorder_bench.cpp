// The flight recorder's cost per collective call (comm/flight_recorder.h): what every
// ProcessGroup call pays for enqueued + started + ended, from one thread and from several at once
// (the recorder has one lock; the backends' worker threads and the caller share it).
#include <benchmark/benchmark.h>

#include "comm/flight_recorder.h"

namespace {

rg::dist::CollectiveCall bucket_call() {
  rg::dist::CollectiveCall c;
  c.op = "all_reduce";
  c.reduce_op = "sum";
  c.dtype = "f32";
  c.shapes = {{6553600}};
  c.device = "cpu";
  return c;
}

void BM_FlightRecorderPerCall(benchmark::State& state) {
  static rg::dist::FlightRecorder recorder(2048);
  rg::dist::CollectiveCall call = bucket_call();
  for (auto _ : state) {
    ++call.seq;
    const uint64_t id = recorder.enqueued(call);
    recorder.started(id, 1.0);
    recorder.ended(id, 2.0);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_FlightRecorderPerCall)->Threads(1)->Threads(4);

}  // namespace

BENCHMARK_MAIN();
