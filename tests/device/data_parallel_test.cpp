// DataParallel (layers/data_parallel.h) on several devices of one process: scatter and gather
// (chunks as torch.chunk, gradients routed back to each part's device), and training that
// follows one device with the whole batch: the same batch, the same initial weights, SGD with
// momentum, an uneven last chunk. Needs at least two devices: ctest runs the emulated build with
// RG_EMU_DEVICES=3; on a real machine it skips with fewer than two GPUs.
#include "layers/data_parallel.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "device/device_test_util.h"
#include "engine/cuda/runtime.h"
#include "engine/ops/binary.h"
#include "engine/ops/loss.h"
#include "engine/ops/reduce.h"
#include "layers/linear.h"
#include "layers/models/mlp.h"
#include "layers/models/registry.h"
#include "layers/optim/optimizer.h"
#include "support/errors.h"

namespace rg {
namespace {

using testing::expect_close;
using testing::random_tensor;

int device_count() { return cuda::runtime().device_count(); }

class DataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RG_REQUIRE_DEVICE();
    if (device_count() < 2) GTEST_SKIP() << "DataParallel needs two devices";
  }
  std::vector<Device> devices(int n) {
    std::vector<Device> d;
    for (int k = 0; k < n; ++k) d.push_back(Device::cuda(k));
    return d;
  }
};

TEST_F(DataParallelTest, ScatterChunksAsTorchAndGatherRoutesGradients) {
  Generator gen(3);
  const Tensor x = random_tensor({5, 3}, gen);
  const std::vector<Tensor> parts = nn::scatter(x, devices(2));
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].shape(), (Shape{3, 3}));  // ceil(5 / 2)
  EXPECT_EQ(parts[1].shape(), (Shape{2, 3}));
  EXPECT_EQ(parts[1].device(), Device::cuda(1));
  // Fewer rows than devices: fewer chunks.
  EXPECT_EQ(nn::scatter(random_tensor({1, 3}, gen), devices(2)).size(), 1u);

  std::vector<Tensor> leaves;
  for (const Tensor& p : parts) {
    Tensor l = p.detach();
    l.set_requires_grad(true);
    leaves.push_back(l);
  }
  const Tensor out = nn::gather(leaves, Device::cuda(0));
  EXPECT_EQ(out.device(), Device::cuda(0));
  expect_close(out.to(Device::cpu()), x, 0, 0, "gather");
  const Tensor weights = random_tensor({5, 3}, gen);
  sum(mul(out, weights.to(Device::cuda(0)))).backward();
  EXPECT_EQ(leaves[1].grad().device(), Device::cuda(1));
  expect_close(leaves[0].grad().to(Device::cpu()), weights.narrow(0, 0, 3), 0, 0, "grad 0");
  expect_close(leaves[1].grad().to(Device::cpu()), weights.narrow(0, 3, 2), 0, 0, "grad 1");
}

// The parameters after `steps` SGD steps (momentum 0.9) of an MLP on one batch of 10, trained
// through DataParallel over `n` devices (n = 1: plain training on cuda:0, the reference).
// `model` (on cuda:0) over cuda:0..n-1 with replicas from `make`; null for one device.
std::unique_ptr<nn::DataParallel> data_parallel(const std::shared_ptr<nn::Module>& model, int n,
                                                const nn::DataParallel::ReplicaFactory& make) {
  if (n <= 1) return nullptr;
  std::vector<Device> devs;
  for (int k = 0; k < n; ++k) devs.push_back(Device::cuda(k));
  return std::make_unique<nn::DataParallel>(model, devs, make);
}

std::vector<Tensor> train(int n, int steps, std::vector<double>* losses = nullptr) {
  const auto make = [] {
    Generator init(11);
    return std::make_shared<nn::MLP>(6, std::vector<int64_t>{16}, 4, init);
  };
  auto model = make();
  model->to(Device::cuda(0));
  const std::unique_ptr<nn::DataParallel> dp = data_parallel(model, n, make);
  optim::Sgd opt(model->parameters(), optim::SgdOptions{0.1, 0.9, 0.0, 0.0, false});
  Generator gen(5);
  for (int s = 0; s < steps; ++s) {
    const Tensor x = random_tensor({10, 6}, gen);
    Tensor y = Tensor::empty({10}, DType::i64);
    for (int i = 0; i < 10; ++i) y.data<int64_t>()[i] = (i * 7 + s) % 4;
    opt.zero_grad();
    const Tensor logits = dp ? dp->forward(x) : model->forward(x.to(Device::cuda(0)));
    Tensor loss = cross_entropy(logits, y.to(Device::cuda(0)));
    loss.backward();
    if (losses) losses->push_back(loss.item());
    opt.step();
  }
  std::vector<Tensor> out;
  for (const Tensor& p : model->parameters()) out.push_back(p.detach().to(Device::cpu()));
  return out;
}

// A linear layer that notes, by the device it ran on, the thread of each forward and how many
// forwards that thread had run (a thread-local count: a thread's id may be reused after it ends).
class ThreadNoting : public nn::Module {
 public:
  using Notes = std::map<std::string, std::vector<std::pair<std::thread::id, int>>>;
  explicit ThreadNoting(Notes* threads) : threads_(threads) {
    Generator init(11);
    fc_ = register_module("fc", std::make_shared<nn::Linear>(6, 4, init));
  }
  std::string type_name() const override { return "ThreadNoting"; }

 protected:
  Tensor forward_impl(const Tensor& x) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      thread_local int runs = 0;
      (*threads_)[x.device().str()].emplace_back(std::this_thread::get_id(), ++runs);
    }
    return fc_->forward(x);
  }

 private:
  Notes* threads_;
  std::shared_ptr<nn::Linear> fc_;
  static inline std::mutex mu_;
};

// Each further replica runs on a thread of its own, the same one every forward (what ops cache
// per thread, such as cuDNN's plans, is built once), and the first on the caller's thread.
TEST_F(DataParallelTest, EachReplicaKeepsItsThreadFromForwardToForward) {
  ThreadNoting::Notes threads;
  const auto make = [&threads] { return std::make_shared<ThreadNoting>(&threads); };
  auto model = make();
  model->to(Device::cuda(0));
  const int n = std::min(device_count(), 3);
  nn::DataParallel dp(model, devices(n), make);
  Generator gen(6);
  for (int i = 0; i < 3; ++i) {
    dp.forward(random_tensor({6, 6}, gen));
  }
  dp.forward(random_tensor({1, 6}, gen));  // one row: only the first device has a part
  ASSERT_EQ(threads.size(), size_t(n));
  EXPECT_EQ(threads["cuda:0"].size(), 4u);
  for (const auto& [id, runs] : threads["cuda:0"]) EXPECT_EQ(id, std::this_thread::get_id());
  std::set<std::thread::id> seen{std::this_thread::get_id()};
  for (int k = 1; k < n; ++k) {
    const auto& notes = threads[Device::cuda(k).str()];
    ASSERT_EQ(notes.size(), 3u) << "cuda:" << k;
    for (size_t i = 0; i < notes.size(); ++i) {
      EXPECT_EQ(notes[i].first, notes[0].first) << "cuda:" << k;
      EXPECT_EQ(notes[i].second, int(i) + 1) << "cuda:" << k << ": a new thread";
    }
    EXPECT_TRUE(seen.insert(notes[0].first).second) << "cuda:" << k << " shares a thread";
  }
}

TEST_F(DataParallelTest, TrainsLikeOneDeviceWithTheWholeBatch) {
  std::vector<double> one_losses;
  const std::vector<Tensor> one = train(1, 4, &one_losses);
  for (int n : {2, 3}) {
    if (n > device_count()) continue;
    std::vector<double> dp_losses;
    const std::vector<Tensor> dp = train(n, 4, &dp_losses);
    ASSERT_EQ(dp.size(), one.size());
    // Only the order of the gradient sums differs (each device's chunk, then the reduction):
    // float rounding.
    for (size_t i = 0; i < dp.size(); ++i)
      expect_close(dp[i], one[i], 1e-6, 1e-5, "parameter " + std::to_string(i));
    for (size_t s = 0; s < dp_losses.size(); ++s)
      EXPECT_NEAR(dp_losses[s], one_losses[s], 1e-5) << n << " devices, step " << s;
  }
}

// ToyNet (without dropout, whose masks follow memory order) for 3 SGD steps of batch 6 on `n`
// devices, with its weights and batches channels last when asked: the parameters after them.
std::vector<Tensor> train_toynet(int n, bool channels_last) {
  const auto make = [] {
    return nn::make_model({.name = "toynet",
                           .sample_shape = {1, 28, 28},
                           .num_classes = 10,
                           .seed = 3,
                           .dropout = false});
  };
  auto model = make();
  model->to(Device::cuda(0));
  if (channels_last) model->to(MemoryFormat::channels_last);
  const std::unique_ptr<nn::DataParallel> dp = data_parallel(model, n, make);
  optim::Sgd opt(model->parameters(), optim::SgdOptions{0.1, 0.9, 0.0, 0.0, false});
  Generator gen(5);
  for (int s = 0; s < 3; ++s) {
    Tensor x = random_tensor({6, 1, 28, 28}, gen);
    if (channels_last) x = x.contiguous(MemoryFormat::channels_last);
    Tensor y = Tensor::empty({6}, DType::i64);
    for (int i = 0; i < 6; ++i) y.data<int64_t>()[i] = (i * 7 + s) % 10;
    opt.zero_grad();
    const Tensor logits = dp ? dp->forward(x) : model->forward(x.to(Device::cuda(0)));
    cross_entropy(logits, y.to(Device::cuda(0))).backward();
    opt.step();
  }
  std::vector<Tensor> out;
  for (const Tensor& p : model->parameters()) {
    EXPECT_EQ(p.grad().memory_format(), p.memory_format());
    out.push_back(p.detach().to(Device::cpu()));
  }
  return out;
}

// A channels_last model: its replicas lie channels last too, and their gradients come back in
// the parameters' layout (the optimizer refuses any other).
TEST_F(DataParallelTest, AChannelsLastModelTrainsLikeOneContiguousDevice) {
  const std::vector<Tensor> one = train_toynet(1, false);
  const std::vector<Tensor> dp = train_toynet(2, true);
  ASSERT_EQ(dp.size(), one.size());
  for (size_t i = 0; i < dp.size(); ++i)
    expect_close(dp[i], one[i], 1e-5, 1e-4, "parameter " + std::to_string(i));
}

TEST_F(DataParallelTest, BadArgumentsAreClearErrors) {
  auto model = std::make_shared<nn::MLP>(6, std::vector<int64_t>{4}, 2);
  rg::testing::expect_error([&] { nn::DataParallel(model, devices(2), [] { return nullptr; }); },
                            "is on cpu, not on the first device cuda:0");
  model->to(Device::cuda(0));
  rg::testing::expect_error(
      [&] {
        nn::DataParallel(model, {Device::cuda(0), Device::cuda(0)},
                         [] { return std::make_shared<nn::MLP>(6, std::vector<int64_t>{4}, 2); });
      },
      "device cuda:0 is given twice");
  rg::testing::expect_error(
      [&] {
        nn::DataParallel(model, devices(2),
                         [] { return std::make_shared<nn::MLP>(6, std::vector<int64_t>{5}, 2); });
      },
      "does not match the module's");
}

}  // namespace
}  // namespace rg
