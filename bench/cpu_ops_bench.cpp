// CPU micro-benchmarks: OpenBLAS sgemm (square and the GEMM shapes conv2d runs), conv2d forward
// and forward+backward at the ResNet-18 CIFAR shapes (batch 32), and elementwise ops in GB/s.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "engine/ops/binary.h"
#include "engine/ops/conv2d.h"
#include "engine/ops/factory.h"
#include "engine/ops/unary.h"
#include "kernels/binary.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/runtime_env.h"
#include "kernels/unary.h"

// OpenBLAS picks its kernels by CPU model; reported so that results can be judged.
extern "C" char* openblas_get_corename(void);

namespace rg {
namespace {

using benchmark::Counter;
using kernels::cpu::Conv2dGeometry;
using Clock = std::chrono::steady_clock;

constexpr int64_t kBatch = 32;
// The 3x3 stride-1 pad-1 convolutions of ResNet-18 on CIFAR: {channels, feature-map size}.
constexpr int64_t kResNetLayers[][2] = {{64, 32}, {128, 16}, {256, 8}, {512, 4}};

// Best square-sgemm rate seen so far in this run; the conv benchmarks report their ratio to it.
double g_best_sgemm_gflops = 0;

Conv2dGeometry resnet_geometry(int64_t channels, int64_t size) {
  return {kBatch, channels, size, size, channels, 3, 3, 1, 1, 1, 1, 1, 1, size, size};
}

double conv_flops(const Conv2dGeometry& g) {
  return 2.0 * double(g.n * g.o * g.c * g.kh * g.kw * g.ho * g.wo);
}

void report_gflops(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOP/s"] =
      Counter(flops_per_iteration * 1e-9, Counter::kIsIterationInvariantRate);
}

// The ratio counter uses our own clock: Google Benchmark's rates are computed after we return.
void report_sgemm_ratio(benchmark::State& state, double flops_per_iteration, double seconds) {
  if (g_best_sgemm_gflops <= 0 || seconds <= 0) return;
  const double gflops = flops_per_iteration * double(state.iterations()) * 1e-9 / seconds;
  state.counters["vs_sgemm"] = gflops / g_best_sgemm_gflops;
}

Tensor random_f32(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return rand(shape, gen, DType::f32);
}

// C [m, n] = op(A) [m, k] * op(B) [k, n], row-major, as kernels::cpu::gemm calls OpenBLAS.
void sgemm(benchmark::State& state, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
           bool square) {
  const Tensor a = random_f32({m * k}, 1), b = random_f32({k * n}, 2);
  Tensor c = zeros({m * n});
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* pc = c.data<float>();
  const auto start = Clock::now();
  for (auto _ : state) {
    kernels::cpu::gemm<float>(ta, tb, m, n, k, 1.f, pa, ta ? m : k, pb, tb ? k : n, 0.f, pc, n);
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double flops = 2.0 * double(m) * double(n) * double(k);
  report_gflops(state, flops);
  if (square && seconds > 0.1) {
    g_best_sgemm_gflops =
        std::max(g_best_sgemm_gflops, flops * double(state.iterations()) * 1e-9 / seconds);
  }
}

// Raw kernels: what the convolution costs without allocation or autograd; `channels_last`: the
// same layer on NHWC arrays (the buffers' shapes are only sizes here).
void conv_kernel(benchmark::State& state, Conv2dGeometry g, bool backward, bool channels_last) {
  g.channels_last = channels_last;
  const Tensor x = random_f32({g.n, g.c, g.h, g.w}, 3);
  const Tensor w = random_f32({g.o, g.c, g.kh, g.kw}, 4);
  const Tensor gy = random_f32({g.n, g.o, g.ho, g.wo}, 5);
  Tensor y = empty({g.n, g.o, g.ho, g.wo}), gx = empty(x.shape()), gw = empty(w.shape());
  const auto start = Clock::now();
  for (auto _ : state) {
    using K = kernels::Conv2d<kernels::Cpu>;
    K::forward<float>(g, x.data<float>(), w.data<float>(), nullptr, y.data<float>(), false, {}, {});
    if (backward) {
      K::backward<float>(g, x.data<float>(), w.data<float>(), gy.data<float>(), gx.data<float>(),
                         gw.data<float>(), nullptr, false, {}, {});
    }
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double flops = conv_flops(g) * (backward ? 3 : 1);
  report_gflops(state, flops);
  report_sgemm_ratio(state, flops, seconds);
}

// The engine op with autograd: conv2d(x, w) then backward, as a training step runs it.
void conv_autograd(benchmark::State& state, const Conv2dGeometry& g) {
  Tensor x = random_f32({g.n, g.c, g.h, g.w}, 3).set_requires_grad(true);
  Tensor w = random_f32({g.o, g.c, g.kh, g.kw}, 4).set_requires_grad(true);
  const Tensor gy = random_f32({g.n, g.o, g.ho, g.wo}, 5);
  const auto start = Clock::now();
  for (auto _ : state) {
    Tensor y = conv2d(x, w, Tensor(), {g.sh, g.sw}, {g.ph, g.pw});
    y.backward(gy);
    x.zero_grad();
    w.zero_grad();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  report_gflops(state, 3 * conv_flops(g));
  report_sgemm_ratio(state, 3 * conv_flops(g), seconds);
}

enum class Elementwise { add, mul, exp };

// Bytes moved per element: two inputs and one output for add/mul, one of each for exp.
void elementwise(benchmark::State& state, Elementwise op, int64_t n, bool engine) {
  const Tensor a = random_f32({n}, 6), b = random_f32({n}, 7);
  Tensor out = empty({n});
  for (auto _ : state) {
    if (engine) {
      Tensor r = op == Elementwise::add ? add(a, b) : op == Elementwise::mul ? mul(a, b) : exp(a);
      benchmark::DoNotOptimize(r.raw_data());
    } else if (op == Elementwise::exp) {
      kernels::Unary<kernels::Cpu>::unary<float>(kernels::UnaryOp::exp, a.data<float>(),
                                                 out.data<float>(), n, {});
    } else {
      kernels::Binary<kernels::Cpu>::binary<float>(
          op == Elementwise::add ? kernels::BinaryOp::add : kernels::BinaryOp::mul, a.data<float>(),
          b.data<float>(), out.data<float>(), n, {});
    }
    benchmark::ClobberMemory();
  }
  const double bytes = double(n) * sizeof(float) * (op == Elementwise::exp ? 2 : 3);
  state.counters["GB/s"] = Counter(bytes * 1e-9, Counter::kIsIterationInvariantRate);
}

// The engine's own cost per op (dispatch, output allocation, autograd's record): add on
// one-element tensors, so the kernel is nothing; with `grad`, the inputs require gradients and
// each iteration also runs the backward (AddBackward, two gradient accumulations). A GPU step
// pays this on the host for every op before the launch itself.
void op_overhead(benchmark::State& state, bool grad) {
  Tensor a = random_f32({1}, 6), b = random_f32({1}, 7);
  if (grad) {
    a.set_requires_grad(true);
    b.set_requires_grad(true);
  }
  for (auto _ : state) {
    Tensor r = add(a, b);
    if (grad) r.backward();
    benchmark::DoNotOptimize(r.raw_data());
  }
}

std::string shape_name(const kernels::cpu::GemmShape& s) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
}

std::string layer_name(const Conv2dGeometry& g) {
  return std::to_string(g.c) + "ch_" + std::to_string(g.h) + "x" + std::to_string(g.w);
}

// Registered by hand for readable names; the order matters: square sgemm runs first so that
// the conv benchmarks can report vs_sgemm.
int register_all() {
  using benchmark::RegisterBenchmark;
  const std::string core = openblas_get_corename();
  benchmark::AddCustomContext("openblas_core", core);
  if (core == "Prescott") {
    // OpenBLAS 0.3.21 does not know recent CPUs (e.g. Emerald Rapids) and falls back to SSE3.
    benchmark::AddCustomContext("openblas_warning",
                                "generic SSE3 kernels; set OPENBLAS_CORETYPE (e.g. SkylakeX, "
                                "Haswell) to the CPU's family");
  }
  for (int64_t s : {512, 1024, 2048}) {
    const std::string name = "sgemm/square/" + std::to_string(s);
    RegisterBenchmark(name.c_str(), sgemm, s, s, s, false, false, true)
        ->UseRealTime()
        ->MinTime(s >= 2048 ? 1.0 : 0.5);
  }
  for (const auto& [channels, size] : kResNetLayers) {
    const Conv2dGeometry g = resnet_geometry(channels, size);
    // The input gradient of these layers (c == o, stride 1) runs the forward's GEMMs.
    const auto fwd = kernels::cpu::conv2d_forward_gemm(g, sizeof(float));
    const auto dw = kernels::cpu::conv2d_weight_grad_gemm(g, sizeof(float));
    const std::string base = "sgemm/" + layer_name(g);
    RegisterBenchmark((base + "/fwd_" + shape_name(fwd)).c_str(), sgemm, fwd.m, fwd.n, fwd.k, false,
                      false, false)
        ->UseRealTime()
        ->MinTime(0.3);
    RegisterBenchmark((base + "/dweight_" + shape_name(dw)).c_str(), sgemm, dw.m, dw.n, dw.k, false,
                      true, false)
        ->UseRealTime()
        ->MinTime(0.3);
  }
  for (const auto& [channels, size] : kResNetLayers) {
    const Conv2dGeometry g = resnet_geometry(channels, size);
    const std::string base = "conv2d/" + layer_name(g) + "_b32";
    RegisterBenchmark((base + "/fwd").c_str(), conv_kernel, g, false, false)
        ->UseRealTime()
        ->MinTime(1.0);
    RegisterBenchmark((base + "/fwd+bwd").c_str(), conv_kernel, g, true, false)
        ->UseRealTime()
        ->MinTime(1.5);
    RegisterBenchmark((base + "/fwd+bwd_channels_last").c_str(), conv_kernel, g, true, true)
        ->UseRealTime()
        ->MinTime(1.5);
    RegisterBenchmark((base + "/fwd+bwd_autograd").c_str(), conv_autograd, g)
        ->UseRealTime()
        ->MinTime(1.0);
  }
  const std::pair<const char*, Elementwise> ops[] = {
      {"add", Elementwise::add}, {"mul", Elementwise::mul}, {"exp", Elementwise::exp}};
  for (const auto& [name, op] : ops) {
    for (int64_t n : {int64_t(1) << 16, int64_t(1) << 22}) {
      for (bool engine : {false, true}) {
        const std::string full =
            std::string("elementwise/") + name + (engine ? "/op/" : "/kernel/") + std::to_string(n);
        RegisterBenchmark(full.c_str(), elementwise, op, n, engine)->UseRealTime()->MinTime(0.2);
      }
    }
  }
  RegisterBenchmark("overhead/add/1", op_overhead, false)->UseRealTime()->MinTime(0.3);
  RegisterBenchmark("overhead/add+backward/1", op_overhead, true)->UseRealTime()->MinTime(0.3);
  return 0;
}

[[maybe_unused]] const int g_registered = register_all();

}  // namespace
}  // namespace rg

int main(int argc, char** argv) {
  rg::kernels::cpu::ensure_runtime_env(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
