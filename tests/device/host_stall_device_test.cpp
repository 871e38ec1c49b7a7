// Host-blocking calls in a training step on the device (engine/cuda/backend.h: counted by the
// emulated runtime; a real runtime does not count them and these tests skip there). A step that
// runs ahead of the GPU has none.
#include <gtest/gtest.h>

#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "device/device_test_util.h"
#include "engine/cuda/runtime.h"
#if defined(RG_CUDA_EMU)
#include "kernels/emu/shim/cudnn.h"  // the emulated cuDNN's call counts
#endif
#include "engine/device_checks.h"
#include "engine/ops/embedding.h"
#include "engine/ops/loss.h"
#include "kernels/error.h"
#include "layers/models/registry.h"
#include "layers/optim/optimizer.h"
#include "support/errors.h"

namespace rg {
namespace {

using testing::kCuda;
using testing::random_tensor;

int64_t host_blocking_calls() { return cuda::runtime().backend().host_blocking_calls(); }

// Host-blocking calls of one steady training step (after two warm-up steps) of `model` on the
// device, with its batch already there: forward, cross entropy, backward, SGD with momentum;
// inside a DeferredChecks scope (as the trainer and ringgrad-bench train run) unless `deferred`
// is false. gpt-* models take token ids (sample {block}) and predict every position.
int64_t per_step(const std::function<int64_t()>& counter, const std::string& model_name,
                 const Shape& sample, bool deferred = true) {
  const bool gpt = model_name.starts_with("gpt-");
  const int64_t classes = gpt ? 16 : 10;
  auto model = nn::make_model({.name = model_name, .sample_shape = sample, .num_classes = classes});
  model->to(kCuda);
  model->train();
  optim::Sgd opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  Generator gen(3);
  Shape batch = sample;
  batch.insert(batch.begin(), 2);
  const Tensor x =
      gpt ? from_vector<int64_t>(std::vector<int64_t>(size_t(2 * sample[0]), 5), batch).to(kCuda)
          : random_tensor(batch, gen).to(kCuda);
  const Tensor y =
      gpt ? from_vector<int64_t>(std::vector<int64_t>(size_t(2 * sample[0]), 3), {2 * sample[0]})
                .to(kCuda)
          : from_vector<int64_t>({1, 7}, {2}).to(kCuda);
  std::optional<DeferredChecks> checks;
  if (deferred) checks.emplace();
  auto step = [&] {
    if (checks) checks->poll();
    opt.zero_grad();
    Tensor out = model->forward(x);
    if (gpt) out = out.view({-1, out.size(2)});
    cross_entropy(out, y).backward();
    opt.step();
  };
  step();
  step();
  const int64_t before = counter();
  step();
  const int64_t count = counter() - before;
  if (checks) checks->flush();  // the targets were valid: nothing raised
  return count;
}

int64_t stalls_per_step(const std::string& model_name, const Shape& sample, bool deferred = true) {
  return per_step(host_blocking_calls, model_name, sample, deferred);
}

class HostStalls : public ::testing::Test {
 protected:
  void SetUp() override {
    RG_REQUIRE_DEVICE();
    if (host_blocking_calls() < 0) GTEST_SKIP() << "this CUDA runtime does not count host stalls";
  }
};

// The issue "ResNet-18 on Hopper": no host stall in a steady step. Batch norm counts its batches
// on the device (no read of num_batches_tracked), cross_entropy and embedding post their target
// and index checks to the DeferredChecks scope. A synchronizing read put back into any of these
// ops (or a new one) fails here, naming the model.
TEST_F(HostStalls, ASteadyStepHasNone) {
  for (const auto& [name, shape] : {std::pair<std::string, Shape>{"mlp", {1, 28, 28}},
                                    {"toynet", {1, 28, 28}},
                                    {"resnet18", {3, 8, 8}},
                                    {"gpt-nano", {8}}}) {
    const int64_t stalls = stalls_per_step(name, shape);
    std::cout << "[          ] " << name << ": " << stalls << " host-blocking calls per step\n";
    EXPECT_EQ(stalls, 0) << name << ": a host stall in the training step";
  }
}

// Without the scope cross_entropy reads its check back at once: a copy into pageable memory and a
// stream synchronization (what a user's own loop gets, and the proof that the count sees them).
TEST_F(HostStalls, WithoutDeferredChecksTheLossCheckStalls) {
  EXPECT_EQ(stalls_per_step("mlp", {1, 28, 28}, /*deferred=*/false), 2);
}

// A bad target inside the scope is raised by flush() (or a later poll), with the op's message.
TEST_F(HostStalls, ADeferredBadTargetIsRaisedLater) {
  const Tensor logits = full({2, 3}, 0.5, DType::f32, kCuda);
  const Tensor bad = from_vector<int64_t>({1, 7}, {2}).to(kCuda);
  DeferredChecks checks;
  checks.set_context("training step 4 of epoch 1");
  const int64_t before = host_blocking_calls();
  const Tensor loss = cross_entropy(logits, bad);  // returns without reading anything back
  EXPECT_EQ(host_blocking_calls() - before, 0);
  EXPECT_EQ(checks.pending(), 1u);
  try {
    checks.flush();
    ADD_FAILURE() << "flush() raised nothing";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "cross_entropy: target 7 at index 1 is out of range for 3 classes (training "
                 "step 4 of epoch 1)");
  }
  EXPECT_EQ(checks.pending(), 0u);
}

// An embedding's bad index is deferred the same way, and quoted exactly: the kernel writes it
// beside its position and the check reads it as an i64 (2^53 + 1 has no double).
TEST_F(HostStalls, ADeferredBadEmbeddingIndexIsQuotedExactly) {
  const Tensor weight = full({5, 3}, 0.5, DType::f32, kCuda);
  const int64_t huge = (int64_t(1) << 53) + 1;
  const Tensor indices = from_vector<int64_t>({0, huge, 7}, {3}).to(kCuda);
  DeferredChecks checks;
  const int64_t before = host_blocking_calls();
  const Tensor out = embedding(weight, indices);
  EXPECT_EQ(host_blocking_calls() - before, 0);
  EXPECT_EQ(checks.pending(), 1u);
  const std::string e = testing::error_of([&] { checks.flush(); });
  EXPECT_NE(e.find("embedding: index 9007199254740993 at position 1 is out of range for 5 "
                   "embeddings"),
            std::string::npos)
      << e;
}

#if defined(RG_CUDA_EMU)
// cuDNN descriptors (convolution, batch norm, pooling) are created once per shape and thread
// (kernels/cuda/cudnn_common.h, cudnn::cached), and the graph API's (tensors, operations, plans,
// variant packs) once per configuration, handle and thread (kernels/cuda/conv2d_graph.cu): a
// steady ResNet-18 step creates none; a step used to create and destroy ~130, each a host-side
// cost per op.
TEST_F(HostStalls, ASteadyStepCreatesNoCudnnDescriptor) {
  const auto created = [] {
    int64_t backend = 0;  // the graph API's (conv2d's default): plans, variant packs, ...
    for (const cudnnBackendDescriptorType_t type :
         {CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, CUDNN_BACKEND_ENGINE_DESCRIPTOR,
          CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR,
          CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
          CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
          CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
          CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
          CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
          CUDNN_BACKEND_TENSOR_DESCRIPTOR}) {
      backend += emu::cudnn_backend_created(type);
    }
    return backend + emu::cudnn_calls("cudnnCreateTensorDescriptor") +
           emu::cudnn_calls("cudnnCreateFilterDescriptor") +
           emu::cudnn_calls("cudnnCreateConvolutionDescriptor");
  };
  const int64_t before = created();
  // 12x12 images: shapes no other test of this program uses, so the warm-up steps create them.
  EXPECT_EQ(per_step(created, "resnet18", {3, 12, 12}), 0);
  EXPECT_GT(created(), before) << "the counter sees the first steps' descriptors";
}
#endif

// The count sees a device-to-host read: it is what the test above relies on.
TEST_F(HostStalls, AReadBackIsCounted) {
  const Tensor t = full({3}, 2.0, DType::f32, kCuda);
  const int64_t before = host_blocking_calls();
  EXPECT_EQ(t.to(Device::cpu()).to_vector<float>()[0], 2.f);
  EXPECT_GE(host_blocking_calls() - before, 1);
}

}  // namespace
}  // namespace rg
