// Google Benchmark entries for the CUDA kernels (kernels/cuda), timed with CUDA events. Each
// reports the bytes it reads and writes as GB/s, to compare with the card's memory bandwidth
// (these kernels are memory-bound). Without a GPU every entry is skipped with a message. Only
// built with CUDA; scripts/gpu-check.sh runs them.
#include <benchmark/benchmark.h>

#include "engine/cuda/event.h"
#include "engine/cuda/stream.h"
#include "engine/tensor.h"
#include "kernels/cuda/collective_reduce.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/fill_cast.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/softmax_loss.h"

namespace {

using namespace rg;
namespace kc = rg::kernels::cuda;

constexpr int64_t kN = int64_t(1) << 26;  // 64 Mi elements: far beyond any cache

Tensor device_tensor(int64_t n, DType dtype = DType::f32) {
  return Tensor::empty({n}, dtype, Device::cuda(0));
}

// Times `launch` with events on the current stream; GB/s = bytes moved per launch / time.
template <class F>
void run(benchmark::State& state, double bytes, F&& launch) {
  if (cuda::device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const cuda::Stream stream = cuda::current_stream(0);
  void* s = stream.handle();
  launch(s);  // warm-up
  stream.synchronize();
  cuda::Event start(true), end(true);
  double seconds = 0;
  for (auto _ : state) {
    start.record(stream);
    launch(s);
    end.record(stream);
    end.synchronize();
    const double t = start.elapsed_ms(end) / 1e3;
    state.SetIterationTime(t);
    seconds += t;
  }
  state.counters["GB/s"] = bytes * double(state.iterations()) / seconds / 1e9;
}

void BM_BinaryAdd(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor a = device_tensor(kN), b = device_tensor(kN), c = device_tensor(kN);
  run(state, 3.0 * kN * 4, [&](void* s) {
    kc::binary(kernels::cpu::BinaryOp::add, a.data<float>(), b.data<float>(), c.data<float>(), kN,
               s);
  });
}

void BM_CastF32ToF16(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor a = device_tensor(kN), b = device_tensor(kN, DType::f16);
  run(state, double(kN) * (4 + 2),
      [&](void* s) { kc::cast(a.data<float>(), b.data<Half>(), kN, s); });
}

void BM_SumAll(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor a = device_tensor(kN), out = device_tensor(1);
  Tensor ws = device_tensor(std::max<int64_t>(1, kc::sum_all_workspace_bytes(kN)), DType::u8);
  run(state, double(kN) * 4,
      [&](void* s) { kc::sum_all(a.data<float>(), kN, out.data<float>(), ws.raw_data(), s); });
}

void BM_SoftmaxRowsOf1000(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  const int64_t c = 1000, rows = kN / c;
  Tensor x = device_tensor(rows * c), y = device_tensor(rows * c);
  run(state, 2.0 * double(rows * c) * 4,
      [&](void* s) { kc::softmax(x.data<float>(), y.data<float>(), rows, c, 1, s); });
}

void BM_SgdMomentumStep(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor p = device_tensor(kN), g = device_tensor(kN), buf = device_tensor(kN);
  const kernels::cpu::SgdParams params{0.01, 0.9, 0.0, 1e-4, false};
  // Reads p, g and buf; writes p and buf.
  run(state, 5.0 * kN * 4, [&](void* s) {
    kc::sgd_step(p.data<float>(), g.data<float>(), buf.data<float>(), kN, params, false, s);
  });
}

void BM_RingReductionStep(benchmark::State& state) {
  if (cuda::device_count() == 0) return run(state, 0, [](void*) {});
  Tensor a = device_tensor(kN), b = device_tensor(kN);
  run(state, 3.0 * kN * 4, [&](void* s) {
    kc::collective_reduce(kernels::cpu::CollectiveOp::sum, a.data<float>(), a.data<float>(),
                          b.data<float>(), kN, s);
  });
}

BENCHMARK(BM_BinaryAdd)->Name("cuda/binary_add_f32")->UseManualTime();
BENCHMARK(BM_CastF32ToF16)->Name("cuda/cast_f32_f16")->UseManualTime();
BENCHMARK(BM_SumAll)->Name("cuda/sum_all_f32")->UseManualTime();
BENCHMARK(BM_SoftmaxRowsOf1000)->Name("cuda/softmax_rows_of_1000_f32")->UseManualTime();
BENCHMARK(BM_SgdMomentumStep)->Name("cuda/sgd_momentum_step_f32")->UseManualTime();
BENCHMARK(BM_RingReductionStep)->Name("cuda/ring_reduce_sum_f32")->UseManualTime();

}  // namespace
