// SyncBatchNorm's module side in one process: convert_sync_batchnorm keeps names and state and
// counts the layers; without collectives, with one replica and in eval mode it is plain batch
// norm and communicates nothing; it takes [N, C] inputs. The multi-rank checks are
// tests/dist/sync_batch_norm_test.cpp.
#include "layers/sync_batch_norm.h"

#include <gtest/gtest.h>

#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/reduce.h"
#include "layers/models/registry.h"
#include "support/errors.h"

namespace rg::nn {
namespace {

// Replicas that all hold this one's batch; counts calls (there must be none where the layer is
// plain batch norm).
class FakeCollectives final : public BatchNormCollectives {
 public:
  explicit FakeCollectives(int size) : size_(size) {}
  int size() const override { return size_; }
  Tensor all_gather(const Tensor& local) override {
    ++calls;
    Tensor out = Tensor::empty({size_ * local.numel()}, local.dtype(), local.device());
    for (int r = 0; r < size_; ++r) out.narrow(0, r * local.numel(), local.numel()).copy_(local);
    return out;
  }
  void all_reduce_sum(const Tensor&) override { ++calls; }
  int calls = 0;

 private:
  int size_;
};

// Resets the process-wide default collectives for one test.
class SyncBatchNormModule : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = default_batch_norm_collectives();
    set_default_batch_norm_collectives(nullptr);
  }
  void TearDown() override { set_default_batch_norm_collectives(saved_); }
  std::shared_ptr<BatchNormCollectives> saved_;
};

std::shared_ptr<Module> resnet() {
  return make_model({.name = "resnet18", .sample_shape = {3, 8, 8}, .num_classes = 10, .seed = 1});
}

TEST_F(SyncBatchNormModule, ConvertKeepsNamesAndStateAndCountsTheLayers) {
  auto model = resnet();
  auto reference = resnet();
  std::vector<std::string> before;
  for (const auto& [name, t] : model->state_dict()) before.push_back(name);
  EXPECT_EQ(convert_sync_batchnorm(*model), 20);
  std::vector<std::string> after;
  for (const auto& [name, t] : model->state_dict()) after.push_back(name);
  EXPECT_EQ(after, before);
  int sync = 0;
  for (const auto& [name, m] : model->named_modules()) sync += m->type_name() == "SyncBatchNorm";
  EXPECT_EQ(sync, 20);
  EXPECT_NE(model->str().find("(bn1): SyncBatchNorm(64"), std::string::npos) << model->str();
  // A converted model loads the plain model's state and the other way round.
  model->load_state_dict(reference->state_dict());
  reference->load_state_dict(model->state_dict());
  // Converting twice is harmless; a model without batch norm has nothing to convert.
  EXPECT_EQ(convert_sync_batchnorm(*model), 20);
  auto mlp = make_model({.name = "mlp", .sample_shape = {1, 28, 28}});
  EXPECT_EQ(convert_sync_batchnorm(*mlp), 0);
  EXPECT_EQ(mlp->str().find("Sync"), std::string::npos);
}

// Training output, input gradient and running statistics of `layer` against BatchNorm2d's.
void expect_plain_batch_norm(BatchNorm2d& layer) {
  BatchNorm2d plain(4);
  Generator gen(3);
  for (int step = 0; step < 2; ++step) {
    const Tensor x = randn({3, 4, 2, 5}, gen);
    Tensor xa = x.clone().set_requires_grad(true), xb = x.clone().set_requires_grad(true);
    const Tensor ya = layer.forward(xa), yb = plain.forward(xb);
    EXPECT_EQ(ya.to_vector<float>(), yb.to_vector<float>());
    sum(ya * x).backward();
    sum(yb * x).backward();
    EXPECT_EQ(xa.grad().to_vector<float>(), xb.grad().to_vector<float>());
  }
  EXPECT_EQ(layer.running_mean.to_vector<float>(), plain.running_mean.to_vector<float>());
  EXPECT_EQ(layer.running_var.to_vector<float>(), plain.running_var.to_vector<float>());
  EXPECT_EQ(layer.num_batches_tracked.item(), 2);
}

TEST_F(SyncBatchNormModule, WithoutAProcessGroupItIsPlainBatchNorm) {
  SyncBatchNorm layer(4);
  EXPECT_EQ(layer.type_name(), "SyncBatchNorm");
  expect_plain_batch_norm(layer);
}

TEST_F(SyncBatchNormModule, WithOneReplicaItIsPlainBatchNormAndCommunicatesNothing) {
  auto one = std::make_shared<FakeCollectives>(1);
  SyncBatchNorm layer(4, 1e-5, 0.1, one);
  expect_plain_batch_norm(layer);
  EXPECT_EQ(one->calls, 0);
  // The default collectives of one replica, as with a world of one.
  set_default_batch_norm_collectives(one);
  SyncBatchNorm by_default(4);
  expect_plain_batch_norm(by_default);
  EXPECT_EQ(one->calls, 0);
}

TEST_F(SyncBatchNormModule, TrainingWithReplicasCommunicatesAndEvalDoesNot) {
  auto two = std::make_shared<FakeCollectives>(2);
  set_default_batch_norm_collectives(two);  // null collectives mean the default ones
  SyncBatchNorm layer(4);
  Generator gen(5);
  Tensor x = randn({3, 4, 2, 2}, gen).set_requires_grad(true);
  sum(layer.forward(x)).backward();
  EXPECT_EQ(two->calls, 2);  // the statistics' all_gather, the gradient sums' all_reduce
  layer.eval();
  const Tensor y = layer.forward(randn({3, 4, 2, 2}, gen));
  EXPECT_EQ(two->calls, 2);
}

// Under autocast a BatchNorm2d sees half activations with its f32 parameters and statistics: the
// synchronized layer computes in f32 and answers in the activations' dtype, as batch_norm does.
TEST_F(SyncBatchNormModule, HalfActivationsWithF32ParametersRunInF32) {
  auto two = std::make_shared<FakeCollectives>(2);  // both replicas hold this batch
  SyncBatchNorm layer(4, 1e-5, 0.1, two);
  BatchNorm2d plain(4);
  Generator gen(7);
  for (DType half : {DType::bf16, DType::f16}) {
    const Tensor x = randn({3, 4, 2, 2}, gen).to(half);
    const Tensor y = layer.forward(x), expected = plain.forward(x);
    EXPECT_EQ(y.dtype(), half);
    EXPECT_EQ(y.to(DType::f32).to_vector<float>(), expected.to(DType::f32).to_vector<float>());
  }
  EXPECT_EQ(two->calls, 2);  // one all_gather per forward, in f32
}

TEST_F(SyncBatchNormModule, TakesTwoDimensionalInputsAsPyTorchs) {
  SyncBatchNorm layer(4);
  Generator gen(5);
  EXPECT_EQ(layer.forward(randn({6, 4}, gen)).shape(), (Shape{6, 4}));
  BatchNorm2d plain(4);
  testing::expect_error(
      [&] {
        plain.forward(randn({6, 4}, gen));
      },
      "BatchNorm2d(4): expected input [N, 4, H, W], got [6, 4]");
  testing::expect_error(
      [&] {
        layer.forward(randn({6, 3}, gen));
      },
      "SyncBatchNorm(4): expected input [N, 4, H, W] or [N, C], got [6, 3]");
}

}  // namespace
}  // namespace rg::nn
