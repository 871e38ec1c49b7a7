// conv2d on cuda:0 through cuDNN's graph (backend) API (kernels/cuda/conv2d_graph.cu), the default,
// against its legacy API (rg::set_cudnn_conv_api). On any device: both agree with the CPU and with
// each other, and deterministic runs repeat their bits. On the emulated cuDNN, whose engines a
// test can choose (emu::cudnn_set_graph_engines; engine 0 tensor cores, 1 non-deterministic, 2
// FMA, 3 unbuildable, 4 unrunnable): the policy filters the engines (no tensor-core engine for f32
// without TF32, only deterministic ones under the switch) and prefers a deterministic one, an
// unbuildable plan is skipped, one that fails its first run hands its configuration to the legacy
// API, the heuristics go from mode A to B to the fallback list and then to the legacy API, the
// chosen plan is built once, benchmark times each usable engine of a configuration once, operands
// less aligned than assumed get a plan of their own, and a steady step makes no descriptor. Each
// test uses its own batch size: the engine choices live for the process.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "device/device_test_util.h"
#include "engine/deterministic.h"
#include "engine/ops/binary.h"
#include "engine/ops/conv2d.h"
#include "engine/ops/cudnn.h"
#include "engine/ops/reduce.h"
#include "engine/ops/shape.h"
#include "support/errors.h"
#if defined(RG_CUDA_EMU)
#include "kernels/emu/shim/cudnn.h"
#endif

namespace rg {
namespace {

using testing::kCuda;
using testing::random_tensor;

class CudnnGraph : public ::testing::Test {
 protected:
  void SetUp() override { RG_REQUIRE_DEVICE(); }
  void TearDown() override {
    set_deterministic_algorithms(false);
    set_cudnn_benchmark(false);
    set_cudnn_conv_api(CudnnConvApi::graph);
#if defined(RG_CUDA_EMU)
    emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::standard);
#endif
  }
};

struct ConvCase {
  Tensor x, w, b, upstream;
};
// A 3x3 convolution (stride 2 when `strided`) of batch n, 4 -> 6 channels on 11x9 images.
ConvCase conv_case(int64_t n, bool strided = false) {
  Generator gen(uint64_t(300 + n));
  const int64_t ho = strided ? 6 : 11, wo = strided ? 5 : 9;
  return {random_tensor({n, 4, 11, 9}, gen), random_tensor({6, 4, 3, 3}, gen),
          random_tensor({6}, gen), random_tensor({n, 6, ho, wo}, gen)};
}

// conv2d forward and backward of sum(y * upstream) on `device`: y, dx, dw, db.
std::vector<Tensor> conv_pass(Device device, const ConvCase& c, DType t = DType::f32,
                              bool strided = false) {
  Tensor x = c.x.to(t).to(device).detach(), w = c.w.to(t).to(device).detach();
  Tensor b = c.b.to(t).to(device).detach();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const int64_t s = strided ? 2 : 1;
  const Tensor y = conv2d(x, w, b, {s, s}, {1, 1}, {1, 1});
  sum(y * c.upstream.to(t).to(device)).backward();
  return {y.to(Device::cpu()), x.grad().to(Device::cpu()), w.grad().to(Device::cpu()),
          b.grad().to(Device::cpu())};
}

void expect_close_all(const std::vector<Tensor>& actual, const std::vector<Tensor>& expected,
                      DType t, const std::string& what) {
  const testing::Tolerance tol = testing::tolerance_for(t);
  const char* names[] = {"y", "dx", "dw", "db"};
  for (size_t i = 0; i < expected.size(); ++i) {
    testing::expect_close(actual[i].to(DType::f64), expected[i].to(DType::f64), tol.atol, tol.rtol,
                          what + " " + names[i]);
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), size_t(a.nbytes())) == 0;
}

// Real cuDNN or emulated: both APIs compute the CPU's convolution, in every dtype, strided too.
TEST_F(CudnnGraph, GraphAndLegacyApisAgreeWithTheCpu) {
  const cuda::Tf32Guard full_f32(false, false);
  for (const DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (const bool strided : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + (strided ? ", stride 2" : ", stride 1"));
      const ConvCase c = conv_case(2, strided);
      // The CPU computes f16/bf16 values in f32.
      const DType ref = t == DType::f64 ? DType::f64 : DType::f32;
      ConvCase rounded{c.x.to(t).to(ref), c.w.to(t).to(ref), c.b.to(t).to(ref),
                       c.upstream.to(t).to(ref)};
      const std::vector<Tensor> cpu = conv_pass(Device::cpu(), rounded, ref, strided);
      set_cudnn_conv_api(CudnnConvApi::graph);
      const std::vector<Tensor> graph = conv_pass(kCuda, c, t, strided);
      set_cudnn_conv_api(CudnnConvApi::legacy);
      const std::vector<Tensor> legacy = conv_pass(kCuda, c, t, strided);
      expect_close_all(graph, cpu, t, "graph API");
      expect_close_all(legacy, cpu, t, "legacy API");
    }
  }
}

// Real cuDNN or emulated: deterministic engines give the same bits run after run.
TEST_F(CudnnGraph, DeterministicRunsRepeatTheirBits) {
  set_deterministic_algorithms(true);
  const ConvCase c = conv_case(3);
  const std::vector<Tensor> a = conv_pass(kCuda, c), b = conv_pass(kCuda, c);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << "output " << i;
}

#if defined(RG_CUDA_EMU)
// Passes run by each emulated engine and by the legacy API since construction.
class EngineRuns {
 public:
  EngineRuns() : before_(now()) {}
  int64_t engine(int index) const { return now()[size_t(index)] - before_[size_t(index)]; }
  int64_t legacy() const { return now()[5] - before_[5]; }
  int64_t heuristics(const char* mode) const {
    return emu::cudnn_calls(std::string("heuristics mode ") + mode) - modes_.at(mode);
  }

 private:
  static std::vector<int64_t> now() {
    return {emu::cudnn_engine_executions(0),
            emu::cudnn_engine_executions(1),
            emu::cudnn_engine_executions(2),
            emu::cudnn_engine_executions(3),
            emu::cudnn_engine_executions(4),
            emu::cudnn_calls("cudnnConvolutionForward") +
                emu::cudnn_calls("cudnnConvolutionBackwardData") +
                emu::cudnn_calls("cudnnConvolutionBackwardFilter")};
  }
  std::vector<int64_t> before_;
  std::map<std::string, int64_t> modes_{{"A", emu::cudnn_calls("heuristics mode A")},
                                        {"B", emu::cudnn_calls("heuristics mode B")},
                                        {"fallback", emu::cudnn_calls("heuristics mode fallback")}};
};

TEST_F(CudnnGraph, TheDefaultRunsTheGraphApiAndTheSwitchTheLegacyApi) {
  const ConvCase c = conv_case(4);
  const cuda::Tf32Guard full_f32(false, false);
  const EngineRuns graph_runs;
  const std::vector<Tensor> graph = conv_pass(kCuda, c);
  // f32 without TF32: engine 0 (tensor cores) is filtered out, engine 2 (FMA) runs all 3 passes.
  EXPECT_EQ(graph_runs.engine(0), 0);
  EXPECT_EQ(graph_runs.engine(2), 3);
  EXPECT_EQ(graph_runs.legacy(), 0);
  set_cudnn_conv_api(CudnnConvApi::legacy);
  const EngineRuns legacy_runs;
  const std::vector<Tensor> legacy = conv_pass(kCuda, c);
  EXPECT_EQ(legacy_runs.legacy(), 3);
  EXPECT_EQ(legacy_runs.engine(2), 0);
  // The same arithmetic (the CPU convolution in f32 on both emulated paths): the same bits.
  for (size_t i = 0; i < graph.size(); ++i) {
    EXPECT_TRUE(same_bits(graph[i], legacy[i])) << "output " << i;
  }
}

TEST_F(CudnnGraph, Tf32TakesTheTensorCoreEngineAndRoundsLikeTheLegacyApi) {
  const ConvCase c = conv_case(5);
  const cuda::Tf32Guard tf32(true, false);
  const EngineRuns runs;
  const std::vector<Tensor> graph = conv_pass(kCuda, c);
  EXPECT_EQ(runs.engine(0), 3);
  EXPECT_EQ(runs.engine(2), 0);
  set_cudnn_conv_api(CudnnConvApi::legacy);
  const std::vector<Tensor> legacy = conv_pass(kCuda, c);
  for (size_t i = 0; i < graph.size(); ++i) {
    EXPECT_TRUE(same_bits(graph[i], legacy[i])) << "output " << i;
  }
}

// Without the switch a deterministic engine is preferred (as the legacy API's choice), and a list
// with only non-deterministic ones gives one; under the switch those are skipped.
TEST_F(CudnnGraph, TheDeterministicSwitchSkipsNonDeterministicEngines) {
  emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::nondeterministic_first);
  const cuda::Tf32Guard tf32(true, false);
  const ConvCase c = conv_case(6);
  const EngineRuns off;
  conv_pass(kCuda, c);
  EXPECT_EQ(off.engine(1), 0) << "the heuristics' first engine is not deterministic";
  EXPECT_EQ(off.engine(0), 3) << "the first deterministic engine";
  set_deterministic_algorithms(true);
  const EngineRuns on;
  conv_pass(kCuda, c);
  EXPECT_EQ(on.engine(1), 0);
  EXPECT_EQ(on.engine(0), 3);

  set_deterministic_algorithms(false);
  emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::nondeterministic_only);
  const ConvCase d = conv_case(13);
  const EngineRuns only;
  conv_pass(kCuda, d);
  EXPECT_EQ(only.engine(1), 3) << "mode A's list has only a non-deterministic engine";
  EXPECT_EQ(only.heuristics("B"), 0);
  set_deterministic_algorithms(true);
  const EngineRuns switched;
  const std::vector<Tensor> out = conv_pass(kCuda, d);
  EXPECT_EQ(switched.engine(1), 0);
  EXPECT_EQ(switched.engine(2), 3) << "the fallback list's deterministic engine";
  expect_close_all(out, conv_pass(Device::cpu(), d), DType::f32, "fallback engine");
}

// A plan that finalizes but fails its first run: the legacy API serves its configuration from
// then on (with a warning naming the status), with the same results.
TEST_F(CudnnGraph, APlanThatFailsItsFirstRunHandsItsConfigurationToTheLegacyApi) {
  emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::unrunnable_first);
  const cuda::Tf32Guard full_f32(false, false);
  const ConvCase c = conv_case(14);
  const EngineRuns first;
  ::testing::internal::CaptureStderr();
  const std::vector<Tensor> out = conv_pass(kCuda, c);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(first.engine(4), 0);
  EXPECT_EQ(first.engine(2), 0);
  EXPECT_EQ(first.legacy(), 3);
  EXPECT_NE(err.find("its plan failed to run: CUDNN_STATUS_EXECUTION_FAILED"), std::string::npos)
      << err;
  const EngineRuns again;
  conv_pass(kCuda, c);
  EXPECT_EQ(again.legacy(), 3);
  EXPECT_EQ(again.heuristics("A"), 0);
  expect_close_all(out, conv_pass(Device::cpu(), c), DType::f32, "legacy after a failed plan");
}

// RG_CUDNN_LOG=1: each choice, once per configuration, on stderr (graph API: the engine and how it
// was chosen; legacy API: the algorithm).
TEST_F(CudnnGraph, TheChoiceLogNamesEachConfigurationsEngineOnce) {
  const cuda::Tf32Guard full_f32(false, false);
  const ConvCase c = conv_case(15);
  ::setenv("RG_CUDNN_LOG", "1", 1);
  ::testing::internal::CaptureStderr();
  conv_pass(kCuda, c);
  conv_pass(kCuda, c);
  set_cudnn_conv_api(CudnnConvApi::legacy);
  conv_pass(kCuda, c);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ::unsetenv("RG_CUDNN_LOG");
  const std::string forward =
      "ringgrad: cuDNN graph API: the conv2d forward of 15x4x11x9 (NCHW), 6 filters of 3x3, "
      "stride 1x1, padding 1x1, dilation 1x1, f32: engine 2 (heuristics mode A, position 1, "
      "deterministic, workspace 256 bytes)\n";
  EXPECT_NE(err.find(forward), std::string::npos) << err;
  EXPECT_EQ(err.find(forward, err.find(forward) + 1), std::string::npos) << "logged once";
  EXPECT_NE(err.find("cuDNN graph API: the conv2d backward (weight gradient) of 15x4x11x9"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("ringgrad: cuDNN legacy API: the conv2d backward (input gradient) of "
                     "15x4x11x9 (NCHW), 6 filters of 3x3, stride 1x1, padding 1x1, dilation 1x1, "
                     "f32: algorithm "),
            std::string::npos)
      << err;
  size_t lines = 0;
  for (char ch : err) lines += ch == '\n';
  EXPECT_EQ(lines, 6u) << err;
  // Off: nothing.
  ::testing::internal::CaptureStderr();
  conv_pass(kCuda, conv_case(16));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST_F(CudnnGraph, AnUnbuildablePlanIsSkipped) {
  emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::unsupported_first);
  const cuda::Tf32Guard tf32(true, false);
  const ConvCase c = conv_case(7);
  const EngineRuns runs;
  const std::vector<Tensor> out = conv_pass(kCuda, c);
  EXPECT_EQ(runs.engine(3), 0);
  EXPECT_EQ(runs.engine(0), 3);
  EXPECT_EQ(runs.legacy(), 0);
}

TEST_F(CudnnGraph, TheHeuristicsGoFromModeAToBToTheFallbackListThenToTheLegacyApi) {
  const cuda::Tf32Guard full_f32(false, false);
  emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::fallback_only);
  const ConvCase c = conv_case(8);
  const EngineRuns fallback;
  const std::vector<Tensor> from_fallback = conv_pass(kCuda, c);
  // Each of the 3 passes asks A, then B, then the fallback list once to choose; the chosen plan
  // is the one built while choosing.
  EXPECT_EQ(fallback.heuristics("A"), 3);
  EXPECT_EQ(fallback.heuristics("B"), 3);
  EXPECT_EQ(fallback.heuristics("fallback"), 3);
  EXPECT_EQ(fallback.engine(2), 3);
  // Nothing from any mode: the legacy API serves the configuration, with the same results.
  emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::none);
  const ConvCase other = conv_case(9);
  const EngineRuns none;
  const std::vector<Tensor> legacy = conv_pass(kCuda, other);
  EXPECT_EQ(none.legacy(), 3);
  EXPECT_EQ(none.engine(2), 0);
  const EngineRuns again;
  conv_pass(kCuda, other);
  EXPECT_EQ(again.heuristics("A"), 0) << "the fallback to the legacy API is cached";
  EXPECT_EQ(again.legacy(), 3);
  expect_close_all(legacy, conv_pass(Device::cpu(), other), DType::f32, "legacy fallback");
  expect_close_all(from_fallback, conv_pass(Device::cpu(), c), DType::f32, "fallback list");
}

TEST_F(CudnnGraph, BenchmarkTimesEachUsableEngineOfAConfigurationOnce) {
  emu::cudnn_set_graph_engines(emu::CudnnGraphEngines::nondeterministic_first);
  const cuda::Tf32Guard tf32(true, false);
  set_cudnn_benchmark(true);
  const ConvCase c = conv_case(10);
  const EngineRuns first;
  const std::vector<Tensor> out = conv_pass(kCuda, c);
  // Engines 1, 0 and 2 each run 3 times per pass while timed (a warm-up and two timed runs), then
  // the fastest runs the pass: 3 passes x (9 + 1).
  EXPECT_EQ(first.engine(0) + first.engine(1) + first.engine(2), 3 * 10);
  EXPECT_GE(first.engine(1), 3 * 3);
  EXPECT_GE(first.engine(2), 3 * 3);
  const EngineRuns second;
  conv_pass(kCuda, c);
  EXPECT_EQ(second.engine(0) + second.engine(1) + second.engine(2), 3) << "no timing again";
  set_deterministic_algorithms(true);
  const EngineRuns deterministic;
  conv_pass(kCuda, c);
  EXPECT_EQ(deterministic.engine(1), 0) << "the non-deterministic engine is not timed";
  EXPECT_EQ(deterministic.engine(0) + deterministic.engine(2), 3 * 7);
  // The timed choice may be engine 0, which runs f32 in TF32.
  const std::vector<Tensor> cpu = conv_pass(Device::cpu(), c);
  for (size_t i = 0; i < cpu.size(); ++i) {
    testing::expect_close(out[i], cpu[i], testing::kTf32Tolerance.atol,
                          testing::kTf32Tolerance.rtol, "benchmark, output " + std::to_string(i));
  }
}

TEST_F(CudnnGraph, OperandsLessAlignedThanAssumedGetAPlanOfTheirOwn) {
  const cuda::Tf32Guard full_f32(false, false);
  const ConvCase c = conv_case(11);
  // x starts one f32 into its storage: 4-byte aligned, not 16 as the plans assume. The emulated
  // cuDNN refuses to run a plan on operands less aligned than its tensors declare.
  const int64_t n = 11 * 4 * 11 * 9;
  Generator gen(17);
  const Tensor storage = random_tensor({n + 1}, gen).to(kCuda);
  Tensor x = storage.flat_narrow(1, n).reshape({11, 4, 11, 9});
  ASSERT_EQ(reinterpret_cast<uintptr_t>(x.raw_data()) % 16, 4u);
  const Tensor w = c.w.to(kCuda);
  const EngineRuns runs;
  const Tensor y = conv2d(x, w, Tensor(), {1, 1}, {1, 1}, {1, 1});
  EXPECT_EQ(runs.engine(2), 1);
  // The workspace query's 16-byte plan, then the run's 4-byte one: each chosen and built once.
  EXPECT_EQ(runs.heuristics("A"), 2);
  testing::expect_close(y.to(Device::cpu()),
                        conv2d(x.to(Device::cpu()), c.w, Tensor(), {1, 1}, {1, 1}, {1, 1}), 1e-5,
                        1e-5, "misaligned operand");
}
#endif

}  // namespace
}  // namespace rg
