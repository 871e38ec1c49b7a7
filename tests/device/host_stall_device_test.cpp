// Host-blocking calls in a training step on the device (engine/cuda/backend.h: counted by the
// emulated runtime; a real runtime does not count them and these tests skip there). A step that
// runs ahead of the GPU has none; each one found today is named here, so that a new stall fails
// the test and removing one shows in its output (issue "ResNet-18 on Hopper": 0 is the goal).
#include <gtest/gtest.h>

#include <iostream>
#include <memory>

#include "device/device_test_util.h"
#include "engine/cuda/runtime.h"
#include "engine/ops/loss.h"
#include "layers/models/registry.h"
#include "layers/optim/optimizer.h"

namespace rg {
namespace {

using testing::kCuda;
using testing::random_tensor;

int64_t host_blocking_calls() { return cuda::runtime().backend().host_blocking_calls(); }

// Host-blocking calls of one steady training step (after two warm-up steps) of `model` on the
// device, with its batch already there: forward, cross entropy, backward, SGD with momentum.
int64_t stalls_per_step(const std::string& model_name, const Shape& sample) {
  auto model = nn::make_model({.name = model_name, .sample_shape = sample, .num_classes = 10});
  model->to(kCuda);
  model->train();
  optim::Sgd opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  Generator gen(3);
  Shape batch = sample;
  batch.insert(batch.begin(), 4);
  const Tensor x = random_tensor(batch, gen).to(kCuda);
  const Tensor y = from_vector<int64_t>({1, 7, 3, 0}, {4}).to(kCuda);
  auto step = [&] {
    opt.zero_grad();
    cross_entropy(model->forward(x), y).backward();
    opt.step();
  };
  step();
  step();
  const int64_t before = host_blocking_calls();
  step();
  return host_blocking_calls() - before;
}

class HostStalls : public ::testing::Test {
 protected:
  void SetUp() override {
    RG_REQUIRE_DEVICE();
    if (host_blocking_calls() < 0) GTEST_SKIP() << "this CUDA runtime does not count host stalls";
  }
};

// Today two per step: cross_entropy's check that every target is a valid class reads a flag back
// (engine/ops/loss.cpp, Tensor::item: a copy into pageable memory, which waits, and a stream
// synchronization). The trainer adds its own (the pageable batch copies, the loss it logs: 8 per
// ToyNet step in all); ringgrad-bench profile shows them per step.
TEST_F(HostStalls, ASteadyStepHasOnlyTheKnownStalls) {
  constexpr int64_t kKnown = 2;
  for (const auto& [name, shape] :
       {std::pair<std::string, Shape>{"mlp", {1, 28, 28}}, {"toynet", {1, 28, 28}}}) {
    const int64_t stalls = stalls_per_step(name, shape);
    std::cout << "[          ] " << name << ": " << stalls << " host-blocking calls per step\n";
    EXPECT_LE(stalls, kKnown) << name << ": a new host stall in the training step";
  }
}

// The count sees a device-to-host read: it is what the test above relies on.
TEST_F(HostStalls, AReadBackIsCounted) {
  const Tensor t = full({3}, 2.0, DType::f32, kCuda);
  const int64_t before = host_blocking_calls();
  EXPECT_EQ(t.to(Device::cpu()).to_vector<float>()[0], 2.f);
  EXPECT_GE(host_blocking_calls() - before, 1);
}

}  // namespace
}  // namespace rg
