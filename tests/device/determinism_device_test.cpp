// rg::set_deterministic_algorithms and rg::set_cudnn_benchmark on cuda:0. On the emulated cuDNN,
// whose offered convolution algorithms a test can choose (emu::cudnn_set_conv_algorithms): a pass
// offered only non-deterministic algorithms is an error naming it under the switch and runs
// without it; with a deterministic alternative the switch takes it, benchmark alone takes the
// fastest; benchmark times each configuration once (cudnnFind* call counts). Those three tests are
// of cuDNN's legacy convolution API (set_cudnn_conv_api(legacy)); the graph API's own are in
// cudnn_graph_device_test.cpp. On any device, with the default (graph) API:
// benchmark on and off agree with the CPU, and two deterministic trainings of a small CNN give
// the same bits, and embedding's backward with duplicate indices has the CPU's bits. Each test
// uses its own shapes, since the algorithm cache lives for the process.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "device/device_test_util.h"
#include "engine/deterministic.h"
#include "engine/ops/binary.h"
#include "engine/ops/conv2d.h"
#include "engine/ops/cudnn.h"
#include "engine/ops/embedding.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/ops/reduce.h"
#include "layers/models/toynet.h"
#include "layers/optim/optimizer.h"
#include "support/errors.h"
#if defined(RG_CUDA_EMU)
#include "kernels/emu/shim/cudnn.h"
#endif

namespace rg {
namespace {

using testing::kCuda;
using testing::random_tensor;

// Restores the switches (and the emulated cuDNN's offer) after each test. TF32 is off: these tests
// compare f32 convolutions with the CPU's as f32 (engine/tf32.h).
class Determinism : public ::testing::Test {
 protected:
  void SetUp() override { RG_REQUIRE_DEVICE(); }
  const cuda::Tf32Guard full_f32_{false, false};
  void TearDown() override {
    set_deterministic_algorithms(false);
    set_cudnn_benchmark(false);
    set_cudnn_conv_api(CudnnConvApi::graph);
#if defined(RG_CUDA_EMU)
    emu::cudnn_set_conv_algorithms(emu::CudnnConvAlgorithms::deterministic);
#endif
  }
};

// conv2d forward and backward of sum(y * upstream) on `device`: y, dx, dw, db.
std::vector<Tensor> conv_pass(Device device, const Tensor& x0, const Tensor& w0, const Tensor& b0,
                              const Tensor& upstream) {
  Tensor x = x0.to(device).detach(), w = w0.to(device).detach(), b = b0.to(device).detach();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const Tensor y = conv2d(x, w, b, {1, 1}, {1, 1}, {1, 1});
  sum(y * upstream.to(device)).backward();
  return {y.to(Device::cpu()), x.grad().to(Device::cpu()), w.grad().to(Device::cpu()),
          b.grad().to(Device::cpu())};
}

struct ConvCase {
  Tensor x, w, b, upstream;
};
// A convolution of batch n (the tests keep their shapes apart by n).
ConvCase conv_case(int64_t n) {
  Generator gen(uint64_t(100 + n));
  return {random_tensor({n, 3, 9, 7}, gen), random_tensor({5, 3, 3, 3}, gen),
          random_tensor({5}, gen), random_tensor({n, 5, 9, 7}, gen)};
}

void expect_matches_cpu(const std::vector<Tensor>& dev, const ConvCase& c,
                        const std::string& what) {
  const std::vector<Tensor> cpu = conv_pass(Device::cpu(), c.x, c.w, c.b, c.upstream);
  const testing::Tolerance tol = testing::tolerance_for(DType::f32);
  const char* names[] = {"y", "dx", "dw", "db"};
  for (size_t i = 0; i < cpu.size(); ++i) {
    testing::expect_close(dev[i], cpu[i], tol.atol, tol.rtol, what + " " + names[i]);
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), size_t(a.nbytes())) == 0;
}

#if defined(RG_CUDA_EMU)
TEST_F(Determinism, ConvWithOnlyNonDeterministicAlgorithmsIsANamedErrorUnderTheSwitch) {
  set_cudnn_conv_api(CudnnConvApi::legacy);
  emu::cudnn_set_conv_algorithms(emu::CudnnConvAlgorithms::nondeterministic_only);
  const ConvCase c = conv_case(2);
  // Without the switch the non-deterministic algorithm runs and is right.
  const int64_t filter0 = emu::cudnn_conv_algo_calls("cudnnConvolutionBackwardFilter", 0);
  expect_matches_cpu(conv_pass(kCuda, c.x, c.w, c.b, c.upstream), c, "switch off");
  EXPECT_GT(emu::cudnn_conv_algo_calls("cudnnConvolutionBackwardFilter", 0), filter0);
  set_deterministic_algorithms(true);
  testing::expect_error([&] { conv_pass(kCuda, c.x, c.w, c.b, c.upstream); },
                        "conv2d forward on CUDA has no deterministic implementation");
  testing::expect_error([&] { conv_pass(kCuda, c.x, c.w, c.b, c.upstream); },
                        "run without --deterministic");
  // The forward chosen without the switch is not reused under it; the backward is refused too.
  set_deterministic_algorithms(false);
  Tensor x = c.x.to(kCuda).detach(), w = c.w.to(kCuda).detach();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const Tensor y = conv2d(x, w, Tensor(), {1, 1}, {1, 1}, {1, 1});
  set_deterministic_algorithms(true);
  testing::expect_error([&] { sum(y * c.upstream.to(kCuda)).backward(); },
                        "conv2d backward (input gradient) on CUDA has no deterministic "
                        "implementation");
  // Only the weight gradient without a deterministic algorithm: named as such.
  emu::cudnn_set_conv_algorithms(emu::CudnnConvAlgorithms::nondeterministic_only_weight_gradient);
  const ConvCase other = conv_case(7);
  testing::expect_error([&] { conv_pass(kCuda, other.x, other.w, other.b, other.upstream); },
                        "conv2d backward (weight gradient) on CUDA has no deterministic "
                        "implementation");
  set_deterministic_algorithms(false);
  expect_matches_cpu(conv_pass(kCuda, other.x, other.w, other.b, other.upstream), other,
                     "weight gradient, switch off");
}

TEST_F(Determinism, TheSwitchTakesTheDeterministicAlgorithmAndBenchmarkAloneTheFastest) {
  set_cudnn_conv_api(CudnnConvApi::legacy);
  emu::cudnn_set_conv_algorithms(emu::CudnnConvAlgorithms::nondeterministic_first);
  const auto count = [](int algo) {
    return emu::cudnn_conv_algo_calls("cudnnConvolutionBackwardFilter", algo) +
           emu::cudnn_conv_algo_calls("cudnnConvolutionBackwardData", algo);
  };
  const ConvCase c = conv_case(3);
  for (const bool deterministic : {true, false}) {
    for (const bool benchmark : {false, true}) {
      SCOPED_TRACE(std::string("deterministic ") + (deterministic ? "on" : "off") + ", benchmark " +
                   (benchmark ? "on" : "off"));
      set_deterministic_algorithms(deterministic);
      set_cudnn_benchmark(benchmark);
      const int64_t algo0 = count(0), algo1 = count(1);
      expect_matches_cpu(conv_pass(kCuda, c.x, c.w, c.b, c.upstream), c, "");
      // Only benchmark without the switch may take the faster, non-deterministic algorithm 0.
      const bool fastest = benchmark && !deterministic;
      EXPECT_EQ(count(0) - algo0, fastest ? 2 : 0);
      EXPECT_EQ(count(1) - algo1, fastest ? 0 : 2);
    }
  }
}

TEST_F(Determinism, BenchmarkTimesEachConfigurationOnce) {
  set_cudnn_conv_api(CudnnConvApi::legacy);
  const auto finds = [] {
    return emu::cudnn_calls("cudnnFindConvolutionForwardAlgorithm") +
           emu::cudnn_calls("cudnnFindConvolutionBackwardDataAlgorithm") +
           emu::cudnn_calls("cudnnFindConvolutionBackwardFilterAlgorithm");
  };
  const ConvCase c = conv_case(4), other = conv_case(5);
  int64_t before = finds();
  conv_pass(kCuda, c.x, c.w, c.b, c.upstream);
  EXPECT_EQ(finds(), before) << "benchmark off must not time anything";
  set_cudnn_benchmark(true);
  before = finds();
  conv_pass(kCuda, c.x, c.w, c.b, c.upstream);
  EXPECT_EQ(finds() - before, 3) << "forward, input gradient and weight gradient, once each";
  conv_pass(kCuda, c.x, c.w, c.b, c.upstream);
  conv_pass(kCuda, c.x, c.w, c.b, c.upstream);
  EXPECT_EQ(finds() - before, 3) << "the same configuration must hit the cache";
  conv_pass(kCuda, other.x, other.w, other.b, other.upstream);
  EXPECT_EQ(finds() - before, 6) << "another batch size is another configuration";
  set_deterministic_algorithms(true);
  conv_pass(kCuda, other.x, other.w, other.b, other.upstream);
  EXPECT_EQ(finds() - before, 9) << "the deterministic choice is made separately";
}
#endif

// Real cuDNN or emulated: the benchmark's choice computes what the heuristic's does.
TEST_F(Determinism, ConvWithBenchmarkOnAndOffAgreesWithTheCpu) {
  const ConvCase c = conv_case(6);
  set_cudnn_benchmark(false);
  const std::vector<Tensor> heuristic = conv_pass(kCuda, c.x, c.w, c.b, c.upstream);
  set_cudnn_benchmark(true);
  const std::vector<Tensor> timed = conv_pass(kCuda, c.x, c.w, c.b, c.upstream);
  expect_matches_cpu(heuristic, c, "benchmark off");
  expect_matches_cpu(timed, c, "benchmark on");
  set_deterministic_algorithms(true);
  const std::vector<Tensor> a = conv_pass(kCuda, c.x, c.w, c.b, c.upstream);
  const std::vector<Tensor> b = conv_pass(kCuda, c.x, c.w, c.b, c.upstream);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << "output " << i;
}

// Three SGD steps of ToyNet (convolutions, max pooling, dropout, linear, cross entropy) on the
// device under the switch: two runs give the same parameters bit for bit.
std::vector<Tensor> train_toynet() {
  Generator init(3);
  auto dropout_gen = std::make_shared<Generator>(4);
  nn::ToyNet model(init, dropout_gen);
  model.to(kCuda);
  model.train();
  optim::Sgd opt(model.parameters(), optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
  Generator data(5);
  for (int step = 0; step < 3; ++step) {
    const Tensor x = random_tensor({6, 1, 28, 28}, data).to(kCuda);
    std::vector<int64_t> labels;
    for (int64_t i = 0; i < 6; ++i) labels.push_back((i * 7 + step) % 10);
    const Tensor y = from_vector(labels, {6}).to(kCuda);
    opt.zero_grad();
    cross_entropy(model.forward(x), y).backward();
    opt.step();
  }
  std::vector<Tensor> params;
  for (const Tensor& p : model.parameters()) params.push_back(p.detach().to(Device::cpu()));
  return params;
}

TEST_F(Determinism, TwoDeterministicTrainingsGiveTheSameBits) {
  set_deterministic_algorithms(true);
  const std::vector<Tensor> a = train_toynet(), b = train_toynet();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << "parameter " << i;
}

}  // namespace
}  // namespace rg

namespace rg {
namespace {

// embedding's backward sums duplicate rows in position order on both backends without atomics:
// f32 and f64 weight gradients have the CPU's bits, with many duplicates and a padding row.
TEST_F(Determinism, EmbeddingBackwardHasTheCpuBitsWithDuplicates) {
  Generator gen(77);
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < 600; ++i) idx.push_back((i * 7919) % 13);  // every row ~46 times
  const Tensor indices = from_vector<int64_t>(idx, {20, 30});
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor w0 = random_tensor({13, 37}, gen, dtype);
    const Tensor up = random_tensor({20, 30, 37}, gen, dtype);
    std::vector<Tensor> grads;
    for (Device device : {Device::cpu(), kCuda}) {
      Tensor w = w0.to(device).detach();
      w.set_requires_grad(true);
      sum(mul(embedding(w, indices.to(device), 4), up.to(device))).backward();
      grads.push_back(w.grad().to(Device::cpu()));
    }
    ASSERT_EQ(grads[0].numel(), grads[1].numel());
    EXPECT_EQ(std::memcmp(grads[0].raw_data(), grads[1].raw_data(),
                          size_t(grads[0].numel()) * element_size(dtype)),
              0)
        << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace rg
