// --cuda-graphs (train/graph_step.h): training steps captured once as a CUDA graph and replayed
// give the eager steps' parameters, optimizer state and losses bit for bit, through a short batch
// (run eagerly) and a learning-rate change (read by the replays); a replayed step has no host
// stall; what cannot be replayed is refused by name and leaves the model trainable; a bad target in
// a replayed step is still raised. On the emulator in CI and on a GPU with the kit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "data/synthetic.h"
#include "device/device_test_util.h"
#include "engine/autocast.h"
#include "engine/cuda/graph.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/stream.h"
#include "engine/device_checks.h"
#include "engine/generator.h"
#include "engine/ops/attention.h"
#include "engine/ops/dropout.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/ops/reduce.h"
#include "kernels/error.h"
#include "layers/amp/grad_scaler.h"
#include "layers/models/registry.h"
#include "layers/optim/lr_schedule.h"
#include "layers/optim/optimizer.h"
#include "support/errors.h"
#include "support/graph_training.h"
#include "train/graph_step.h"
#include "train/trainer.h"

namespace rg {
namespace {

using testing::kCuda;

struct Training {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::Sgd> opt;
  std::vector<double> losses;
};

Training make_training(const std::string& name, const Shape& sample) {
  manual_seed(11);  // both runs start from the same weights
  Training r;
  r.model = nn::make_model({.name = name, .sample_shape = sample, .num_classes = 10});
  r.model->to(kCuda);
  r.model->train();
  r.opt = std::make_unique<optim::Sgd>(
      r.model->parameters(), optim::SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
  return r;
}

// One training step of `model` on a batch: forward, cross entropy, backward, the optimizer step.
train::GraphStep::Body step_of(nn::Module& model, optim::Optimizer& opt) {
  return [&model, &opt](const Tensor& x, const Tensor& y) {
    Tensor loss = cross_entropy(model.forward(x), y);
    loss.backward();
    opt.step();
    return loss;
  };
}

// The same under f16 autocast with `scaler`: the scaled backward, its step and update.
train::GraphStep::Body f16_step_of(nn::Module& model, optim::Optimizer& opt,
                                   amp::GradScaler& scaler) {
  return [&model, &opt, &scaler](const Tensor& x, const Tensor& y) {
    Tensor loss;
    {
      const AutocastGuard autocast(kCuda, DType::f16);
      loss = cross_entropy(model.forward(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    return loss;
  };
}

// Batches of 4 samples, the fifth of 2 (an epoch's short last batch), on the device.
std::vector<data::Batch> batches(const Shape& sample, int n) {
  data::SyntheticDataset d(64, sample, 10, 5);
  std::vector<data::Batch> out;
  for (int b = 0; b < n; ++b) {
    const int64_t size = b == 4 ? 2 : 4;
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < size; ++i) idx.push_back(b * 4 + i);
    data::Batch batch = d.get_batch(idx, 0);
    out.push_back({batch.inputs.to(kCuda), batch.targets.to(kCuda), {}});
  }
  return out;
}

void expect_bitwise_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  ASSERT_EQ(x.shape(), y.shape()) << what;
  EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), size_t(x.nbytes())), 0) << what;
}

class CudaGraphTraining : public ::testing::Test {
 protected:
  void SetUp() override { RG_REQUIRE_DEVICE(); }
};

// Eight steps: two eager warm-up steps, a capture, replays, the short batch eagerly, the rate
// lowered at step 6 (the replays read it: no second capture), against the same steps all eager;
// with channels_last the model and the batches in it (the static input buffer takes its layout).
void expect_replays_equal_eager_steps(const std::string& name, const Shape& sample,
                                      bool channels_last = false) {
  SCOPED_TRACE(name);
  std::vector<data::Batch> data = batches(sample, 8);
  Training eager = make_training(name, sample), graphed = make_training(name, sample);
  if (channels_last) {
    for (data::Batch& b : data) b.inputs = b.inputs.contiguous(MemoryFormat::channels_last);
    eager.model->to(MemoryFormat::channels_last);
    graphed.model->to(MemoryFormat::channels_last);
  }
  train::GraphStep graph(*graphed.opt, kCuda);
  DeferredChecks checks;
  for (int s = 0; s < 8; ++s) {
    for (Training* r : {&eager, &graphed}) {
      if (s == 6) r->opt->set_lr(0.01);
      r->opt->zero_grad();
      const train::GraphStep::Body body = step_of(*r->model, *r->opt);
      Tensor loss;
      if (r == &graphed) loss = graph.run(body, data[size_t(s)].inputs, data[size_t(s)].targets);
      if (!loss.defined()) loss = body(data[size_t(s)].inputs, data[size_t(s)].targets);
      r->losses.push_back(loss.item());
    }
  }
  checks.flush();
  EXPECT_EQ(graph.captures(), 1) << "the new rate is written before each replay";
  EXPECT_EQ(graph.replays(), 5) << "steps 2, 3, 5, 6, 7";
  EXPECT_EQ(graph.eager_steps(), 3) << "two warm-up steps and the short batch";
  EXPECT_EQ(eager.losses, graphed.losses);
  const auto pe = eager.model->named_parameters(), pg = graphed.model->named_parameters();
  ASSERT_EQ(pe.size(), pg.size());
  for (size_t i = 0; i < pe.size(); ++i) {
    expect_bitwise_equal(pe[i].second, pg[i].second, pe[i].first);
    expect_bitwise_equal(pe[i].second.grad(), pg[i].second.grad(), pe[i].first + ".grad");
    expect_bitwise_equal(eager.opt->momentum_buffer(i), graphed.opt->momentum_buffer(i),
                         pe[i].first + " momentum");
  }
  const auto be = eager.model->named_buffers(), bg = graphed.model->named_buffers();
  for (size_t i = 0; i < be.size(); ++i)
    expect_bitwise_equal(be[i].second, bg[i].second, be[i].first);
}

TEST_F(CudaGraphTraining, ReplayedStepsEqualEagerStepsBitForBit) {
  // ToyNet's dropout draws from its own generator: each replay sets the offsets its kernels add
  // (cuda::philox_offset), so the masks are the eager steps'.
  for (const auto& [name, sample] : {std::pair<std::string, Shape>{"mlp", {1, 28, 28}},
                                     {"toynet", {1, 28, 28}},
                                     {"resnet18", {3, 8, 8}}}) {
    expect_replays_equal_eager_steps(name, sample);
  }
}

TEST_F(CudaGraphTraining, AChannelsLastResNetReplaysItsEagerStepsBitForBit) {
  expect_replays_equal_eager_steps("resnet18", {3, 8, 8}, /*channels_last=*/true);
}

// Random ops in a graph: each replay draws what the next eager call would (dropout and the
// attention's dropout, forward and backward, from two generators), the capture draws nothing, and
// a generator reseeded after the capture is an error.
TEST_F(CudaGraphTraining, RandomOpsReplayWhatEagerCallsWouldDraw) {
  const cuda::Stream stream = cuda::pooled_stream(0);
  cuda::StreamGuard on(stream);
  Generator eager_gen(21), eager_attn(22), graph_gen(21), graph_attn(22);
  const Tensor x = full({1000}, 1.0, DType::f32, kCuda);
  Generator qkv(5);
  Tensor q = testing::random_tensor({2, 8, 4}, qkv).to(kCuda);
  q.set_requires_grad(true);
  auto step = [&](Generator& g, Generator& a, Tensor& y, Tensor& att, Tensor& gq) {
    y = dropout(x, 0.5, true, g);
    q.set_grad(Tensor());
    att = causal_attention(q.view({1, 2, 8, 4}), q.view({1, 2, 8, 4}), q.view({1, 2, 8, 4}), 0, 0.3,
                           &a);
    sum(att).backward();
    gq = q.grad();
  };
  Tensor y, att, gq;
  cuda::Graph graph(kCuda, [&] { step(graph_gen, graph_attn, y, att, gq); });
  EXPECT_EQ(graph_gen.offset(), 0u) << "the capture drew nothing";
  for (int replay = 0; replay < 2; ++replay) {
    Tensor ey, eatt, egq;
    step(eager_gen, eager_attn, ey, eatt, egq);
    graph.replay();
    expect_bitwise_equal(y, ey, "dropout, replay " + std::to_string(replay));
    expect_bitwise_equal(att, eatt, "attention, replay " + std::to_string(replay));
    expect_bitwise_equal(gq, egq, "attention backward, replay " + std::to_string(replay));
    EXPECT_EQ(graph_gen.offset(), eager_gen.offset());
    EXPECT_EQ(graph_attn.offset(), eager_attn.offset());
  }
  graph_gen.set_state(99, 0);
  const std::string e = testing::error_of([&] { graph.replay(); });
  EXPECT_NE(e.find("was reseeded since the capture"), std::string::npos) << e;
}

// AdamW in a graph: each replay counts its step and takes the learning rate of the moment (a
// schedule changing it at every step), so one capture replays like eager steps, bit for bit,
// moments and step counts included.
TEST_F(CudaGraphTraining, AdamReplaysFollowTheLearningRateWithoutCapturingAgain) {
  const Shape sample{1, 28, 28};
  const std::vector<data::Batch> data = batches(sample, 6);
  Training eager = make_training("toynet", sample), graphed = make_training("toynet", sample);
  std::unique_ptr<optim::Optimizer> eager_opt =
      optim::make_adamw(eager.model->parameters(), {.lr = 1e-3, .weight_decay = 0.1});
  std::unique_ptr<optim::Optimizer> graph_opt =
      optim::make_adamw(graphed.model->parameters(), {.lr = 1e-3, .weight_decay = 0.1});
  train::GraphStep graph(*graph_opt, kCuda, /*warmup_steps=*/1);
  DeferredChecks checks;
  for (int s = 0; s < 6; ++s) {
    if (s == 4) continue;  // the short batch: step 4 has 2 samples (left out here)
    for (Training* r : {&eager, &graphed}) {
      optim::Optimizer& o = r == &eager ? *eager_opt : *graph_opt;
      o.set_lr(1e-3 / double(s + 1));
      o.zero_grad();
      const train::GraphStep::Body body = step_of(*r->model, o);
      Tensor loss;
      if (r == &graphed) loss = graph.run(body, data[size_t(s)].inputs, data[size_t(s)].targets);
      if (!loss.defined()) loss = body(data[size_t(s)].inputs, data[size_t(s)].targets);
      r->losses.push_back(loss.item());
    }
  }
  checks.flush();
  EXPECT_EQ(graph.captures(), 1);
  EXPECT_EQ(graph.replays(), 4);
  EXPECT_EQ(eager.losses, graphed.losses);
  const auto pe = eager.model->named_parameters(), pg = graphed.model->named_parameters();
  for (size_t i = 0; i < pe.size(); ++i)
    expect_bitwise_equal(pe[i].second, pg[i].second, pe[i].first);
  const NamedTensors se = eager_opt->state(), sg = graph_opt->state();
  ASSERT_EQ(se.size(), sg.size());
  for (size_t i = 0; i < se.size(); ++i) {
    EXPECT_EQ(se[i].first, sg[i].first);
    expect_bitwise_equal(se[i].second, sg[i].second, se[i].first);
  }
}

// With full_batch set, a short batch right after the warm-up is not captured: the next full one is
// (without it, the short shape would be captured and every later full batch would run eagerly).
// The optimizer's load_state after the capture (new state tensors, as a resumed checkpoint makes):
// the graph would go on updating the old ones, so GraphStep drops it, runs one step eagerly and
// captures again. Both runs load the momentum they had after step 1 before step 4: the same losses
// bit for bit, with two captures.
TEST_F(CudaGraphTraining, ALoadedOptimizerStateIsCapturedAgain) {
  const Shape sample{1, 28, 28};
  std::vector<data::Batch> data = batches(sample, 4);  // 4 full batches, twice
  for (const data::Batch& b : batches(sample, 4)) data.push_back(b);
  Training eager = make_training("toynet", sample), graphed = make_training("toynet", sample);
  train::GraphStep graph(*graphed.opt, kCuda, /*warmup_steps=*/1);
  DeferredChecks checks;
  NamedTensors saved[2];
  for (size_t s = 0; s < data.size(); ++s) {
    for (Training* r : {&eager, &graphed}) {
      NamedTensors& mine = saved[r == &eager ? 0 : 1];
      if (s == 4) r->opt->load_state(mine);
      r->opt->zero_grad();
      const train::GraphStep::Body body = step_of(*r->model, *r->opt);
      Tensor loss;
      if (r == &graphed) loss = graph.run(body, data[s].inputs, data[s].targets);
      if (!loss.defined()) loss = body(data[s].inputs, data[s].targets);
      r->losses.push_back(loss.item());
      if (s == 1) {
        for (const auto& [name, t] : r->opt->state()) mine.emplace_back(name, t.clone());
      }
    }
  }
  checks.flush();
  EXPECT_EQ(graph.captures(), 2);
  EXPECT_EQ(graph.eager_steps(), 2) << "the warm-up and the step after load_state";
  EXPECT_EQ(eager.losses, graphed.losses);
  const auto pe = eager.model->named_parameters(), pg = graphed.model->named_parameters();
  for (size_t i = 0; i < pe.size(); ++i)
    expect_bitwise_equal(pe[i].second, pg[i].second, pe[i].first);
}

TEST_F(CudaGraphTraining, AShortBatchAfterTheWarmUpIsNotCaptured) {
  const Shape sample{1, 28, 28};
  std::vector<data::Batch> data = batches(sample, 5);  // the fifth has 2 samples
  Training r = make_training("mlp", sample);
  train::GraphStep graph(*r.opt, kCuda, /*warmup_steps=*/1, /*full_batch=*/4);
  DeferredChecks checks;
  const train::GraphStep::Body body = step_of(*r.model, *r.opt);
  for (size_t b : {0, 4, 1, 2}) {  // warm-up, short, full, full
    r.opt->zero_grad();
    graph.run(body, data[b].inputs, data[b].targets);
  }
  checks.flush();
  EXPECT_EQ(graph.captures(), 1);
  EXPECT_EQ(graph.replays(), 2) << "both full batches after the short one";
  EXPECT_EQ(graph.eager_steps(), 2) << "the warm-up and the short batch";
}

// A replayed step queues everything and reads nothing back, and the host queues a handful of
// things instead of every kernel (the emulator counts host stalls and submissions).
TEST_F(CudaGraphTraining, AReplayedStepHasNoHostStallAndFewSubmissions) {
  cuda::Backend& backend = cuda::runtime().backend();
  if (backend.host_blocking_calls() < 0) GTEST_SKIP() << "this CUDA runtime does not count them";
  const Shape sample{3, 8, 8};
  const std::vector<data::Batch> data = batches(sample, 4);
  Training r = make_training("resnet18", sample);
  train::GraphStep graph(*r.opt, kCuda, /*warmup_steps=*/2);
  DeferredChecks checks;
  const train::GraphStep::Body body = step_of(*r.model, *r.opt);
  int64_t eager_submissions = 0;
  for (int s = 0; s < 3; ++s) {
    checks.poll();
    r.opt->zero_grad();
    const int64_t before = backend.host_submissions();
    if (!graph.run(body, data[size_t(s)].inputs, data[size_t(s)].targets).defined())
      body(data[size_t(s)].inputs, data[size_t(s)].targets);
    if (s == 1) eager_submissions = backend.host_submissions() - before;  // a warm eager step
  }
  const int64_t stalls = backend.host_blocking_calls();
  const int64_t submissions = backend.host_submissions();
  checks.poll();
  r.opt->zero_grad();
  ASSERT_TRUE(graph.run(body, data[3].inputs, data[3].targets).defined());
  EXPECT_EQ(backend.host_blocking_calls() - stalls, 0);
  const int64_t replayed = backend.host_submissions() - submissions;
  std::cout << "[          ] ResNet-18 step: " << eager_submissions << " submissions eager, "
            << replayed << " replayed\n";
  EXPECT_GT(eager_submissions, 200) << "every kernel of forward, backward and SGD";
  EXPECT_LE(replayed, 4) << "the batch's two copies, the graph, the checks' read-back";
  checks.flush();
}

// --amp f16 with SGD: the GradScaler's scale, its inf/NaN flag and the skip stay on the device,
// so the scaled step is captured (once the warm-up made the momentum buffers) and its replays
// grow the scale, back off on an overflow and skip that step as the eager steps do, bit for bit,
// with no host stall in a replayed step. A growth factor of 2^8 every 2 good steps makes the f16
// gradients overflow in replayed steps.
TEST_F(CudaGraphTraining, AnF16StepWithItsGradScalerReplaysItsEagerStepsBitForBit) {
  cuda::Backend& backend = cuda::runtime().backend();
  const Shape sample{1, 28, 28};
  std::vector<data::Batch> data = batches(sample, 12);
  data[4] = data[5];  // no short batch: the dependency decides the warm-up
  Training eager = make_training("mlp", sample), graphed = make_training("mlp", sample);
  const amp::GradScalerOptions so{.init_scale = 1024.0,
                                  .growth_factor = 256.0,
                                  .backoff_factor = 1.0 / 256,
                                  .growth_interval = 2};
  amp::GradScaler eager_scaler(so), graphed_scaler(so);
  train::GraphStep graph(*graphed.opt, kCuda);
  graph.add_dependency([&] { return graphed_scaler.decides_on_device(*graphed.opt); },
                       [] { return uint64_t(0); });
  DeferredChecks checks;
  std::vector<double> eager_scales, graphed_scales;
  int64_t replay_stalls = 0;
  for (int s = 0; s < 12; ++s) {
    for (Training* r : {&eager, &graphed}) {
      amp::GradScaler& scaler = r == &eager ? eager_scaler : graphed_scaler;
      r->opt->zero_grad();
      const train::GraphStep::Body body = f16_step_of(*r->model, *r->opt, scaler);
      const data::Batch& b = data[size_t(s)];
      Tensor loss;
      if (r == &graphed) {
        const int64_t replays = graph.replays(), stalls = backend.host_blocking_calls();
        loss = graph.run(body, b.inputs, b.targets);
        if (graph.replays() > replays) replay_stalls += backend.host_blocking_calls() - stalls;
      } else {
        loss = body(b.inputs, b.targets);
      }
      r->losses.push_back(loss.item());
      (r == &eager ? eager_scales : graphed_scales).push_back(scaler.get_scale());
    }
  }
  checks.flush();
  EXPECT_EQ(graph.captures(), 1);
  EXPECT_GE(graph.replays(), 8);
  EXPECT_EQ(replay_stalls, 0) << "a replayed f16 step read something back";
  EXPECT_EQ(eager.losses, graphed.losses);
  EXPECT_EQ(eager_scales, graphed_scales);
  // The scale grew and backed off during the replays (steps 4 on).
  bool grew = false, backed_off = false;
  for (size_t i = 4; i < eager_scales.size(); ++i) {
    grew = grew || eager_scales[i] > eager_scales[i - 1];
    backed_off = backed_off || eager_scales[i] < eager_scales[i - 1];
  }
  EXPECT_TRUE(grew);
  EXPECT_TRUE(backed_off) << "no overflow in a replayed step";
  const auto pe = eager.model->named_parameters(), pg = graphed.model->named_parameters();
  for (size_t i = 0; i < pe.size(); ++i) {
    expect_bitwise_equal(pe[i].second, pg[i].second, pe[i].first);
    expect_bitwise_equal(eager.opt->momentum_buffer(i), graphed.opt->momentum_buffer(i),
                         pe[i].first + " momentum");
  }
}

// An optimizer whose steps the host decides: GradScaler reads the flag back and calls step() (the
// reference for one that decides on the device).
class HostDecided final : public optim::Optimizer {
 public:
  explicit HostDecided(std::unique_ptr<optim::Optimizer> inner)
      : Optimizer({{inner->params(), std::nullopt}}, inner->lr(), 0.0), inner_(std::move(inner)) {}
  void step() override {
    inner_->set_lr(lr());
    inner_->step();
  }
  std::string name() const override { return inner_->name(); }
  NamedTensors state() const override { return inner_->state(); }

 private:
  void clear_state() override {}
  bool restore_state(size_t, const std::string&, const Tensor&) override { return false; }
  std::unique_ptr<optim::Optimizer> inner_;
};

// --amp f16 with AdamW: its step counts move to the device (GradScaler::step's step_unless), where
// a kernel counts the steps the overflow flag does not skip and computes the bias corrections;
// eagerly and replayed from a graph (with a new learning rate at every step), the parameters,
// moments and step counts are those of AdamW stepped by the host after reading the flag, bit for
// bit, through growth, overflows and skipped steps, and no replayed step reads anything back.
TEST_F(CudaGraphTraining, AnF16AdamWStepDecidedOnTheDeviceIsTheHostDecidedOneBitForBit) {
  cuda::Backend& backend = cuda::runtime().backend();
  const Shape sample{1, 28, 28};
  std::vector<data::Batch> data = batches(sample, 12);
  data[4] = data[5];
  Training host = make_training("mlp", sample), eager = make_training("mlp", sample),
           graphed = make_training("mlp", sample);
  const optim::AdamOptions ao{.lr = 1e-3, .weight_decay = 0.1};
  std::unique_ptr<optim::Optimizer> host_opt =
      std::make_unique<HostDecided>(optim::make_adamw(host.model->parameters(), ao));
  std::unique_ptr<optim::Optimizer> eager_opt = optim::make_adamw(eager.model->parameters(), ao);
  std::unique_ptr<optim::Optimizer> graph_opt = optim::make_adamw(graphed.model->parameters(), ao);
  EXPECT_FALSE(host_opt->can_skip_on_device());
  EXPECT_TRUE(eager_opt->can_skip_on_device());
  const amp::GradScalerOptions so{.init_scale = 1024.0,
                                  .growth_factor = 256.0,
                                  .backoff_factor = 1.0 / 256,
                                  .growth_interval = 2};
  amp::GradScaler host_scaler(so), eager_scaler(so), graphed_scaler(so);
  train::GraphStep graph(*graph_opt, kCuda);
  graph.add_dependency([&] { return graphed_scaler.decides_on_device(*graph_opt); },
                       [] { return uint64_t(0); });
  DeferredChecks checks;
  std::vector<std::vector<double>> scales(3);
  int64_t replay_stalls = 0, host_stalls = 0, eager_stalls = 0, skipped = 0;
  for (int s = 0; s < 12; ++s) {
    for (int k = 0; k < 3; ++k) {
      Training& r = k == 0 ? host : k == 1 ? eager : graphed;
      optim::Optimizer& o = k == 0 ? *host_opt : k == 1 ? *eager_opt : *graph_opt;
      amp::GradScaler& scaler = k == 0 ? host_scaler : k == 1 ? eager_scaler : graphed_scaler;
      o.set_lr(1e-3 / double(s + 1));
      o.zero_grad();
      const train::GraphStep::Body body = f16_step_of(*r.model, o, scaler);
      const data::Batch& b = data[size_t(s)];
      Tensor loss;
      if (k == 2) {
        const int64_t replays = graph.replays(), stalls = backend.host_blocking_calls();
        loss = graph.run(body, b.inputs, b.targets);
        if (graph.replays() > replays) replay_stalls += backend.host_blocking_calls() - stalls;
      } else {
        const int64_t stalls = backend.host_blocking_calls();
        loss = body(b.inputs, b.targets);
        (k == 0 ? host_stalls : eager_stalls) += backend.host_blocking_calls() - stalls;
      }
      r.losses.push_back(loss.item());
      scales[size_t(k)].push_back(scaler.get_scale());
    }
    if (s > 0 && scales[0][size_t(s)] < scales[0][size_t(s) - 1]) ++skipped;
  }
  checks.flush();
  EXPECT_EQ(graph.captures(), 1);
  EXPECT_GE(graph.replays(), 8);
  EXPECT_EQ(replay_stalls, 0) << "a replayed f16 AdamW step read something back";
  if (backend.host_blocking_calls() >= 0) {  // the emulated runtime counts them
    EXPECT_EQ(eager_stalls, 0) << "an eager f16 AdamW step decided on the device read back";
    EXPECT_GE(host_stalls, 12) << "the host-decided steps read the flag back";
  }
  EXPECT_GE(skipped, 2) << "no overflow (a skipped step) after the first steps";
  EXPECT_EQ(host.losses, eager.losses);
  EXPECT_EQ(host.losses, graphed.losses);
  EXPECT_EQ(scales[0], scales[1]);
  EXPECT_EQ(scales[0], scales[2]);
  const auto ph = host.model->named_parameters(), pe = eager.model->named_parameters(),
             pg = graphed.model->named_parameters();
  for (size_t i = 0; i < ph.size(); ++i) {
    expect_bitwise_equal(ph[i].second, pe[i].second, ph[i].first + " eager");
    expect_bitwise_equal(ph[i].second, pg[i].second, ph[i].first + " replayed");
  }
  // The states (the step counts read back from the device): equal, and fewer than the steps.
  const NamedTensors sh = host_opt->state(), se = eager_opt->state(), sg = graph_opt->state();
  ASSERT_EQ(sh.size(), se.size());
  ASSERT_EQ(sh.size(), sg.size());
  for (size_t i = 0; i < sh.size(); ++i) {
    EXPECT_EQ(sh[i].first, se[i].first);
    expect_bitwise_equal(sh[i].second, se[i].second, sh[i].first + " eager");
    expect_bitwise_equal(sh[i].second, sg[i].second, sh[i].first + " replayed");
    if (sh[i].first.ends_with(".step")) {
      EXPECT_LT(sh[i].second.item(), 12.0) << sh[i].first;
      EXPECT_GE(sh[i].second.item(), 12.0 - double(skipped) - 1) << sh[i].first;
    }
  }
}

// With a huge initial scale the first f16 steps overflow: SGD has no momentum buffers yet, so the
// GradScaler reads the flag back and the step stays eager (a capture then would fail) until a step
// went through; the capture follows, and training matches eager steps bit for bit.
TEST_F(CudaGraphTraining, AnF16StepIsCapturedOnlyOnceTheScalerDecidesOnTheDevice) {
  const Shape sample{1, 28, 28};
  std::vector<data::Batch> data = batches(sample, 10);
  data[4] = data[5];
  Training eager = make_training("mlp", sample), graphed = make_training("mlp", sample);
  const amp::GradScalerOptions so{.init_scale = 1099511627776.0,  // 2^40
                                  .backoff_factor = 1.0 / 65536};
  amp::GradScaler eager_scaler(so), graphed_scaler(so);
  train::GraphStep graph(*graphed.opt, kCuda, /*warmup_steps=*/1);
  graph.add_dependency([&] { return graphed_scaler.decides_on_device(*graphed.opt); },
                       [] { return uint64_t(0); });
  DeferredChecks checks;
  int first_on_device = -1;
  for (int s = 0; s < 10; ++s) {
    for (Training* r : {&eager, &graphed}) {
      amp::GradScaler& scaler = r == &eager ? eager_scaler : graphed_scaler;
      r->opt->zero_grad();
      const train::GraphStep::Body body = f16_step_of(*r->model, *r->opt, scaler);
      const data::Batch& b = data[size_t(s)];
      const Tensor loss =
          r == &graphed ? graph.run(body, b.inputs, b.targets) : body(b.inputs, b.targets);
      r->losses.push_back(loss.item());
    }
    if (first_on_device < 0 && graphed_scaler.decides_on_device(*graphed.opt)) first_on_device = s;
  }
  checks.flush();
  ASSERT_GE(first_on_device, 2) << "the first steps overflowed: read back, no momentum yet";
  EXPECT_EQ(graph.captures(), 1);
  EXPECT_EQ(graph.eager_steps(), first_on_device + 1) << "captured right after";
  EXPECT_EQ(eager.losses, graphed.losses);
  const auto pe = eager.model->named_parameters(), pg = graphed.model->named_parameters();
  for (size_t i = 0; i < pe.size(); ++i)
    expect_bitwise_equal(pe[i].second, pg[i].second, pe[i].first);
}

// A target out of range in a replayed step: the check cross_entropy posted at capture is posted
// again after each replay and raised by the scope.
TEST_F(CudaGraphTraining, ABadTargetInAReplayedStepIsRaised) {
  const Shape sample{1, 28, 28};
  const std::vector<data::Batch> data = batches(sample, 2);
  Training r = make_training("mlp", sample);
  train::GraphStep graph(*r.opt, kCuda, /*warmup_steps=*/1);
  DeferredChecks checks;
  const train::GraphStep::Body body = step_of(*r.model, *r.opt);
  graph.run(body, data[0].inputs, data[0].targets);  // the warm-up step
  ASSERT_TRUE(graph.run(body, data[1].inputs, data[1].targets).defined());
  ASSERT_EQ(graph.replays(), 1);
  checks.flush();  // valid targets: nothing
  const Tensor bad = full({4}, 12.0, DType::i64, kCuda);
  ASSERT_TRUE(graph.run(body, data[1].inputs, bad).defined());
  const std::string e = testing::error_of([&] { checks.flush(); });
  EXPECT_NE(e.find("12"), std::string::npos) << e;
  EXPECT_NE(e.find("out of"), std::string::npos) << e;
}

// The error quotes the bad target its step saw, though the graph's static target buffer holds a
// later batch by the time the flag is read: the kernel writes the value beside the row.
TEST_F(CudaGraphTraining, AReplayedStepsBadTargetIsQuotedAfterTheNextBatchReplacedIt) {
  const Shape sample{1, 28, 28};
  const std::vector<data::Batch> data = batches(sample, 2);
  Training r = make_training("mlp", sample);
  train::GraphStep graph(*r.opt, kCuda, /*warmup_steps=*/1);
  DeferredChecks checks;
  const train::GraphStep::Body body = step_of(*r.model, *r.opt);
  graph.run(body, data[0].inputs, data[0].targets);  // the warm-up step
  ASSERT_TRUE(graph.run(body, data[1].inputs, data[1].targets).defined());  // the capture
  const Tensor bad = from_vector<int64_t>({1, 12, 2, 3}, {4}).to(kCuda);
  ASSERT_TRUE(graph.run(body, data[1].inputs, bad).defined());
  ASSERT_TRUE(graph.run(body, data[0].inputs, data[0].targets).defined());  // overwrites `bad`
  ASSERT_EQ(graph.replays(), 3);
  const std::string e = testing::error_of([&] { checks.flush(); });
  EXPECT_NE(e.find("cross_entropy: target 12 at index 1 is out of range for 10 classes"),
            std::string::npos)
      << e;
}

// An optimizer's first step in a capture (SGD's momentum buffer, Adam's moments would restart at
// every replay) and a CPU device are refused by name, a body that reads a value back fails its
// capture with CUDA's reason; after a failed capture the model trains eagerly.
TEST_F(CudaGraphTraining, WhatCannotBeReplayedIsRefusedByName) {
  manual_seed(3);
  auto model = nn::make_model({.name = "toynet", .sample_shape = {1, 28, 28}, .num_classes = 10});
  model->to(kCuda);
  model->train();
  const std::vector<data::Batch> data = batches({1, 28, 28}, 1);
  DeferredChecks checks;
  for (bool adam : {false, true}) {
    Training r = make_training("mlp", {1, 28, 28});  // SGD with momentum
    std::unique_ptr<optim::Optimizer> opt;
    if (adam) opt = optim::make_adamw(r.model->parameters(), {});
    optim::Optimizer& o = adam ? *opt : *r.opt;
    // The warm-up step does not step the optimizer: its first step is the capture's.
    bool step = false;
    train::GraphStep first(o, kCuda, /*warmup_steps=*/1);
    auto body = [&](const Tensor& x, const Tensor& y) {
      Tensor loss = cross_entropy(r.model->forward(x), y);
      loss.backward();
      if (step) o.step();
      return loss;
    };
    first.run(body, data[0].inputs, data[0].targets);
    o.zero_grad();
    step = true;
    const std::string e =
        testing::error_of([&] { first.run(body, data[0].inputs, data[0].targets); });
    EXPECT_NE(e.find(adam ? "adamw: parameter 0's first step" : "sgd: parameter 0's first step"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("inside a CUDA graph capture: step once before capturing"), std::string::npos)
        << e;
  }
  optim::Sgd sgd(model->parameters(), {.lr = 0.01});
  const std::string cpu = testing::error_of([&] { train::GraphStep g(sgd, Device::cpu()); });
  EXPECT_NE(cpu.find("need a CUDA device"), std::string::npos) << cpu;
  train::GraphStep graph(sgd, kCuda, /*warmup_steps=*/1);
  const train::GraphStep::Body body = step_of(*model, sgd);
  auto reading = [&](const Tensor& x, const Tensor& y) {
    const Tensor loss = body(x, y);
    (void)loss.item();  // a read back: eagerly a stall, in a capture an error
    return loss;
  };
  graph.run(reading, data[0].inputs, data[0].targets);  // the warm-up step
  sgd.zero_grad();
  const std::string e =
      testing::error_of([&] { graph.run(reading, data[0].inputs, data[0].targets); });
  EXPECT_NE(e.find("--cuda-graphs: the training step cannot be captured"), std::string::npos) << e;
  EXPECT_NE(e.find("capturing a CUDA graph on cuda:0"), std::string::npos) << e;
  EXPECT_NE(e.find("operation not permitted when stream is capturing"), std::string::npos) << e;
  const std::string none = testing::error_of([&] { train::GraphStep g(sgd, kCuda, 0); });
  EXPECT_NE(none.find("at least one warm-up step"), std::string::npos) << none;
  EXPECT_EQ(graph.captures(), 0);
  sgd.zero_grad();
  const double loss = body(data[0].inputs, data[0].targets).item();
  EXPECT_TRUE(std::isfinite(loss));
}

// The Trainer with cuda_graphs: two epochs of 4 batches (the last short), the rate decayed after
// the first epoch: the same weights bit for bit as without, captured once.
TEST_F(CudaGraphTraining, TheTrainerReplaysFullBatchesAndMatchesEagerTraining) {
  const Shape sample{1, 28, 28};
  auto data = std::make_shared<data::SyntheticDataset>(14, sample, 10, 9);
  const auto [results, weights] = testing::train_eager_and_graphed(data, sample, 10);
  EXPECT_EQ(results[1].graph_captures, 1) << "epoch 2's decayed rate needs no new capture";
  EXPECT_EQ(results[1].graph_replays, 4) << "epoch 1's third batch, epoch 2's first three";
  EXPECT_EQ(results[1].graph_eager_steps, 4) << "two warm-up steps, then each short batch";
  EXPECT_EQ(results[0].epochs[1].train_loss, results[1].epochs[1].train_loss);
  for (size_t i = 0; i < weights[0].size(); ++i)
    expect_bitwise_equal(weights[0][i].second, weights[1][i].second, weights[0][i].first);
}

}  // namespace
}  // namespace rg
