// Micro-benchmarks made from the op table (tests/ops/op_table.cpp, DESIGN.md section 11): for every
// entry and CPU dtype, op/<name>/<dtype>/fwd and, when the op is differentiable,
// op/<name>/<dtype>/fwd+bwd, on the entry's largest sample (its name is the benchmark's label).
// scripts/ops-bench.py records their times in docs/ops-bench.json for docs/ops.md.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "engine/ops/factory.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/runtime_env.h"
#include "ops/largest_sample.h"
#include "ops/op_table.h"

namespace rg::testing {
namespace {

using V = std::vector<Tensor>;

// The sample's inputs with floating ones converted to `dtype`, as the op-table harness prepares
// them; `differentiated[i]` says which ones a backward differentiates.
struct Prepared {
  V inputs;
  std::vector<bool> differentiated;
};

Prepared prepare(const OpSample& s, DType dtype) {
  Prepared p;
  int64_t floating = 0;
  for (const Tensor& t : s.inputs) {
    const bool f = t.defined() && is_floating(t.dtype());
    p.inputs.push_back(f ? t.to(dtype).detach().clone() : t);
    p.differentiated.push_back(f && (s.grad_inputs < 0 || floating < s.grad_inputs));
    floating += f ? 1 : 0;
  }
  return p;
}

void forward(benchmark::State& state, const OpFn& f, const OpSample& s, DType dtype) {
  const Prepared p = prepare(s, dtype);
  state.SetLabel(s.name);
  for (auto _ : state) {
    Tensor out = f(p.inputs);
    benchmark::DoNotOptimize(out);
  }
}

// Forward, then the gradient of every differentiated input from a fixed random upstream gradient.
// Each iteration starts from fresh leaves (same storage), so no gradient is accumulated onto an
// earlier one.
void forward_backward(benchmark::State& state, const OpFn& f, const OpSample& s, DType dtype) {
  const Prepared p = prepare(s, dtype);
  auto leaves = [&p] {
    V in = p.inputs;
    for (size_t i = 0; i < in.size(); ++i)
      if (p.differentiated[i]) in[i] = in[i].detach().set_requires_grad(true);
    return in;
  };
  const Tensor probe = f(leaves());
  if (!probe.requires_grad()) {
    state.SkipWithError("the output does not require grad");
    return;
  }
  Generator gen(1234);
  const Tensor upstream = rand(probe.shape(), gen, probe.dtype());
  state.SetLabel(s.name);
  for (auto _ : state) {
    const Tensor out = f(leaves());
    out.backward(upstream);
    benchmark::ClobberMemory();
  }
}

void register_op_table() {
  for (const OpEntry& e : op_table()) {
    const OpSample s = largest_sample(e);
    const OpFn f = s.forward ? s.forward : e.forward;
    for (DType dtype : e.cpu_dtypes) {
      const std::string prefix = "op/" + e.name + "/" + dtype_name(dtype) + "/";
      benchmark::RegisterBenchmark((prefix + "fwd").c_str(), forward, f, s, dtype)
          ->Unit(benchmark::kMicrosecond);
      if (e.differentiable) {
        benchmark::RegisterBenchmark((prefix + "fwd+bwd").c_str(), forward_backward, f, s, dtype)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace
}  // namespace rg::testing

int main(int argc, char** argv) {
  rg::kernels::cpu::ensure_runtime_env(argc, argv);
  benchmark::AddCustomContext("rg_threads", std::to_string(rg::kernels::cpu::num_threads()));
  benchmark::AddCustomContext("blas_core", rg::kernels::cpu::blas_core_name());
  rg::testing::register_op_table();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
