// DDP under CUDA graphs (train::GraphStep with the reducer as a dependency), across real processes
// over ProcessGroupNCCL on the emulated NCCL (RG_TEST_BACKEND=nccl; the staged gloo group cannot
// be captured, so the tests skip there): the collectives of a synchronized iteration are captured
// with it (the communication stream joins the capture) and every replay runs them again, so
// replayed DDP steps give the eager DDP steps' losses, parameters, buffers and momentum bit for
// bit, through the one-time rebuild, a short batch run eagerly, gradient_as_bucket_view, the fp16
// hook, static_graph and f16 autocast with its GradScaler; a replayed step queues no host-blocking
// call; a parameter without a
// gradient in the captured iteration, and a rank whose data ends in a replayed one, are still
// named on every rank, one iteration late.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/ddp.h"
#include "comm/init.h"
#include "data/synthetic.h"
#include "engine/autocast.h"
#include "engine/cuda/graph.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/stream.h"
#include "engine/device_checks.h"
#include "engine/generator.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "layers/activation.h"
#include "layers/amp/grad_scaler.h"
#include "layers/batch_norm.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/models/registry.h"
#include "layers/optim/lr_schedule.h"
#include "layers/optim/optimizer.h"
#include "layers/sequential.h"
#include "support/errors.h"
#include "support/graph_training.h"
#include "train/graph_step.h"
#include "train/trainer.h"

namespace rg::dist {
namespace {

constexpr int64_t kB = 4, kClasses = 5, kSide = 6;

bool nccl_backend() { return std::string(default_group()->backend()) == "nccl"; }
// This rank's device (the group's).
Device device() { return default_group()->tensor_device(); }

// Convolution, batch norm (buffers that DDP broadcasts from rank 0 in every forward), ReLU and a
// linear head; `spare` adds a linear layer the forward uses only when told to.
struct Net : nn::Module {
  explicit Net(Generator& gen) {
    body = register_module(
        "body", std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                    std::make_shared<nn::Conv2d>(1, 3, std::array<int64_t, 2>{3, 3}, gen),
                    std::make_shared<nn::BatchNorm2d>(3), std::make_shared<nn::ReLU>(),
                    std::make_shared<nn::Flatten>(),
                    std::make_shared<nn::Linear>(3 * 4 * 4, kClasses, gen)}));
    spare = register_module("spare", std::make_shared<nn::Linear>(kClasses, kClasses, gen));
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor y = body->forward(x);
    return use_spare ? spare->forward(y) : y;
  }
  std::string type_name() const override { return "Net"; }
  std::shared_ptr<nn::Sequential> body;
  std::shared_ptr<nn::Linear> spare;
  bool use_spare = true;
};

// This rank's batch of step s (kB samples; step 4's is short, kB / 2), on the device.
std::pair<Tensor, Tensor> batch(int s) {
  const int64_t n = s == 4 ? kB / 2 : kB;
  Generator gen(uint64_t(100 + 10 * s + default_group()->rank()));
  const Tensor x = rand({n, 1, kSide, kSide}, gen).to(device());
  std::vector<int64_t> y;
  for (int64_t i = 0; i < n; ++i) y.push_back((i + s + default_group()->rank()) % kClasses);
  return {x, from_vector<int64_t>(y, {n}).to(device())};
}

struct Result {
  std::vector<double> losses;
  std::vector<Tensor> state;  // parameters, buffers and momentum, on the host
  int64_t captures = 0, replays = 0, eager = 0;
  uint64_t replay_blocking = 0;  // host-blocking calls inside the replayed steps
  // Per step, DDP's last_timeline(): marked replayed, and its buckets (none for a replay).
  std::vector<bool> timeline_replayed;
  std::vector<size_t> timeline_buckets;
};

constexpr int kSteps = 8;

// kSteps SGD steps with momentum of a DDP Net, eagerly or through a GraphStep; with `f16` under
// f16 autocast with a GradScaler (captured once it leaves the skip to the device).
Result train(const DdpOptions& options, bool graphs, bool f16 = false) {
  Generator gen(3);
  auto net = std::make_shared<Net>(gen);
  net->to(device());
  net->train();
  DistributedDataParallel ddp(net, default_group(), options);
  optim::Sgd opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
  amp::GradScaler scaler({.init_scale = 1024.0, .growth_interval = 2, .enabled = f16});
  std::optional<train::GraphStep> graph;
  if (graphs) {
    graph.emplace(opt, device(), /*warmup_steps=*/2, /*full_batch=*/kB);
    graph->add_dependency([&] { return ddp.reducer().ready_to_capture(); },
                          [&] { return ddp.reducer().buckets_version(); });
    if (f16)
      graph->add_dependency([&] { return scaler.decides_on_device(opt); },
                            [] { return uint64_t(0); });
  }
  const train::GraphStep::Body body = [&](const Tensor& x, const Tensor& y) {
    Tensor loss;
    {
      const AutocastGuard autocast(device(), DType::f16, f16);
      loss = cross_entropy(ddp(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    return loss;
  };
  cuda::Backend& backend = cuda::runtime().backend();
  DeferredChecks checks;
  Result r;
  std::vector<Tensor> losses;
  for (int s = 0; s < kSteps; ++s) {
    const auto [x, y] = batch(s);
    opt.zero_grad(/*set_to_none=*/!options.gradient_as_bucket_view);
    const int64_t replays = graph ? graph->replays() : 0;
    const int64_t blocking = backend.host_blocking_calls();
    losses.push_back(graph ? graph->run(body, x, y) : body(x, y));
    if (graph && graph->replays() > replays)
      r.replay_blocking += uint64_t(backend.host_blocking_calls() - blocking);
    losses.back() = losses.back().clone();  // a replay's loss is rewritten by the next one
    r.timeline_replayed.push_back(ddp.reducer().last_timeline().replayed);
    r.timeline_buckets.push_back(ddp.reducer().last_timeline().buckets.size());
  }
  checks.flush();
  for (const Tensor& l : losses) r.losses.push_back(l.item());
  for (const Tensor& p : net->parameters()) r.state.push_back(p.to(Device::cpu()));
  for (const auto& [name, b] : net->named_buffers()) r.state.push_back(b.to(Device::cpu()));
  for (size_t i = 0; i < net->parameters().size(); ++i)
    r.state.push_back(opt.momentum_buffer(i).to(Device::cpu()));
  if (graph) {
    r.captures = graph->captures();
    r.replays = graph->replays();
    r.eager = graph->eager_steps();
  }
  return r;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), size_t(a.nbytes())) == 0;
}

class DdpCudaGraphs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!nccl_backend())
      GTEST_SKIP() << "DDP's collectives are captured on the NCCL group (RG_TEST_BACKEND=nccl)";
  }
};

// Two eager steps (the second rebuilds the buckets), the capture and replays, step 4's short batch
// eagerly between replays: the eager DDP run's numbers bit for bit, in each configuration.
TEST_F(DdpCudaGraphs, ReplayedIterationsEqualEagerDdpIterationsBitForBit) {
  struct Case {
    const char* name;
    DdpOptions options;
  };
  std::vector<Case> cases(5);
  cases[0].name = "allreduce";
  cases[1].name = "gradient_as_bucket_view";
  cases[1].options.gradient_as_bucket_view = true;
  cases[2].name = "fp16 hook";
  cases[2].options.comm_hook = CommHook::fp16;
  cases[3].name = "static_graph with find_unused_parameters";
  cases[3].options.static_graph = true;
  cases[3].options.find_unused_parameters = true;
  cases[4].name = "f16 autocast with its GradScaler";
  for (Case& c : cases) {
    const bool f16 = std::string(c.name).starts_with("f16");
    SCOPED_TRACE(c.name);
    c.options.bucket_cap_mb = 0.0005;  // several buckets
    c.options.first_bucket_mb = 0.0002;
    c.options.log = nullptr;
    const Result eager = train(c.options, false, f16);
    const Result graphed = train(c.options, true, f16);
    EXPECT_EQ(graphed.captures, 1);
    EXPECT_EQ(graphed.replays, 5) << "steps 2, 3, 5, 6, 7";
    EXPECT_EQ(graphed.eager, 3) << "two warm-up steps and the short batch";
    EXPECT_EQ(graphed.replay_blocking, 0u) << "a replayed DDP step waited for the device";
    // last_timeline(): an eager iteration's buckets, or a replay marked as such (nothing timed).
    const std::vector<bool> replayed = {false, false, true, true, false, true, true, true};
    EXPECT_EQ(graphed.timeline_replayed, replayed) << "steps 2, 3, 5, 6, 7 replayed";
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_FALSE(eager.timeline_replayed[size_t(s)]);
      EXPECT_EQ(graphed.timeline_buckets[size_t(s)],
                replayed[size_t(s)] ? 0u : eager.timeline_buckets[size_t(s)])
          << "step " << s;
    }
    EXPECT_EQ(eager.losses, graphed.losses);
    ASSERT_EQ(eager.state.size(), graphed.state.size());
    for (size_t i = 0; i < eager.state.size(); ++i)
      EXPECT_TRUE(bitwise_equal(eager.state[i], graphed.state[i])) << "state tensor " << i;
  }
}

// A DDP Net with plain SGD through a GraphStep (the reducer its dependency), for the errors raised
// through replays.
struct GraphedDdp {
  GraphedDdp() {
    net->to(device());
    net->train();
    DdpOptions options;
    options.log = nullptr;
    ddp = std::make_unique<DistributedDataParallel>(net, default_group(), options);
    opt = std::make_unique<optim::Sgd>(net->parameters(), optim::SgdOptions{.lr = 0.1});
    graph = std::make_unique<train::GraphStep>(*opt, device(), /*warmup_steps=*/2);
    graph->add_dependency([this] { return ddp->reducer().ready_to_capture(); },
                          [this] { return ddp->reducer().buckets_version(); });
  }
  // One step on the batch of step `b`; the error it raised, or "".
  std::string step(int b) {
    const auto [x, y] = batch(b);
    opt->zero_grad();
    const train::GraphStep::Body body = [this](const Tensor& in, const Tensor& target) {
      Tensor loss = cross_entropy((*ddp)(in), target);
      loss.backward();
      opt->step();
      return loss;
    };
    return testing::error_of([&] { graph->run(body, x, y); });
  }
  Generator gen{3};
  std::shared_ptr<Net> net = std::make_shared<Net>(gen);
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<optim::Sgd> opt;
  std::unique_ptr<train::GraphStep> graph;
  DeferredChecks checks;
};

// The captured iteration leaves a parameter without a gradient (the forward stops using it after
// the warm-up): every replay sends zeros for it and flags it in the status element, which the
// host reads after the next replay, so every rank throws the same named error, one iteration
// late, instead of training on or hanging.
TEST_F(DdpCudaGraphs, AParameterWithoutAGradientInTheCapturedIterationIsNamedOnEveryRank) {
  GraphedDdp t;
  std::string error;
  int failed_at = -1;
  for (int s = 0; s < 6 && error.empty(); ++s) {
    t.net->use_spare = s < 2;  // the capture (step 2) and its replays leave `spare` out
    error = t.step(s == 4 ? 5 : s);
    failed_at = s;
  }
  EXPECT_EQ(t.graph->captures(), 1);
  EXPECT_EQ(failed_at, 3) << "raised after the replay that follows the captured iteration's";
  EXPECT_NE(error.find("reduction could not finish in iteration 3"), std::string::npos) << error;
  EXPECT_NE(error.find("spare.weight, spare.bias got none"), std::string::npos) << error;
  std::string everyone = "ranks 0";
  for (int r = 1; r < default_group()->size(); ++r) everyone += ", " + std::to_string(r);
  EXPECT_NE(error.find(everyone + ": spare"), std::string::npos) << error;
}

// Uneven inputs through replays: rank 0 announces its last batch in a replayed iteration (the
// status element's value is written before each replay from the host), so the next replay's
// status check names it on every rank.
TEST_F(DdpCudaGraphs, ARankWhoseDataEndsInAReplayedIterationIsNamedOnEveryRank) {
  GraphedDdp t;
  std::string error;
  int failed_at = -1;
  for (int s = 0; s < 8 && error.empty(); ++s) {
    if (s == 5 && default_group()->rank() == 0) t.ddp->announce_last_iteration();
    error = t.step(s == 4 ? 5 : s);
    failed_at = s;
  }
  EXPECT_EQ(t.graph->captures(), 1);
  EXPECT_EQ(t.graph->replays(), 4) << "steps 2 to 5 (step 6's raised after its launch)";
  EXPECT_EQ(failed_at, 6);
  EXPECT_NE(error.find("rank 0: ran out of data (its last batch was iteration 6)"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("had more batches after iteration 6"), std::string::npos) << error;
}

// The Trainer with cuda_graphs under DDP: two epochs of 3 full batches and a short one per rank,
// the rate decayed after the first: the eager DDP run's weights and losses bit for bit, captured
// once (after the warm-up, which rebuilds the buckets).
TEST_F(DdpCudaGraphs, TheTrainerCapturesDdpStepsAndMatchesEagerDdpTraining) {
  const Shape sample{1, 8, 8};
  const int64_t per_rank = 14;  // 3 batches of 4 and one of 2
  auto data = std::make_shared<data::SyntheticDataset>(per_rank * default_group()->size(), sample,
                                                       kClasses, 9);
  const auto [results, weights] = testing::train_eager_and_graphed(data, sample, kClasses);
  EXPECT_EQ(results[1].graph_captures, 1);
  EXPECT_EQ(results[1].graph_replays, 4) << "epoch 1's third batch, epoch 2's first three";
  EXPECT_EQ(results[1].graph_eager_steps, 4) << "two warm-up steps, then each short batch";
  EXPECT_EQ(results[0].epochs[1].train_loss, results[1].epochs[1].train_loss);
  for (size_t i = 0; i < weights[0].size(); ++i) {
    const Tensor a = weights[0][i].second.to(Device::cpu()),
                 b = weights[1][i].second.to(Device::cpu());
    EXPECT_TRUE(bitwise_equal(a, b)) << weights[0][i].first;
  }
}

// A barrier cannot be captured (a replay would not hold the host): refused by name, and the stream
// is usable after the failed capture.
TEST_F(DdpCudaGraphs, ABarrierInACaptureIsRefusedByName) {
  const cuda::Stream side = cuda::pooled_stream(device().index);
  const cuda::StreamGuard on(side);
  const std::string e =
      testing::error_of([&] { cuda::Graph graph(device(), [&] { default_group()->barrier(); }); });
  EXPECT_NE(e.find("barrier: cannot be captured into a CUDA graph"), std::string::npos) << e;
  default_group()->barrier()->wait();  // every rank got here; the group still works
}

// A collective queued while the caller's stream is captured by something other than a
// cuda::Graph (a raw cudaStreamBeginCapture) would be replayed without the group's hooks, its
// replays unwatched: refused by name before anything is queued, and the group still works.
TEST_F(DdpCudaGraphs, ACollectiveOnAStreamCapturedOutsideACudaGraphIsRefusedByName) {
  const int d = device().index;
  const cuda::Stream side = cuda::pooled_stream(d);
  const cuda::StreamGuard on(side);
  Tensor t = Tensor::empty({3}, DType::f32, device());
  t.fill_(double(default_group()->rank() + 1));
  cuda::Backend& backend = cuda::runtime().backend();
  backend.begin_capture(d, side.handle());
  EXPECT_TRUE(backend.stream_capturing(d, side.handle()));
  EXPECT_EQ(cuda::Graph::capturing(), nullptr);
  const std::string e = testing::error_of([&] { default_group()->all_reduce(t); });
  backend.destroy_graph(d, backend.end_capture(d, side.handle()));
  EXPECT_FALSE(backend.stream_capturing(d, side.handle()));
  EXPECT_NE(e.find("the current stream is being captured, but not by a cuda::Graph"),
            std::string::npos)
      << e;
  default_group()->all_reduce(t)->wait();
  const int n = default_group()->size();
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(t.to(Device::cpu()).data<float>()[i], float(n * (n + 1) / 2));
}

// Two graphs of one group, each with an all-reduce, replayed alternately and with an eager
// collective between: every launch runs its collective in the order the host queued it, on every
// rank (the group watches each graph's replays with hooks of its own).
TEST_F(DdpCudaGraphs, TwoGraphsOfOneGroupReplayAlternatelyWithEagerCollectivesBetween) {
  const cuda::Stream side = cuda::pooled_stream(device().index);
  const cuda::StreamGuard on(side);
  const int n = default_group()->size(), r = default_group()->rank();
  Tensor a = Tensor::empty({2}, DType::f32, device()), b = Tensor::empty({5}, DType::f32, device());
  a.fill_(double(r + 1));
  b.fill_(double(10 * (r + 1)));
  cuda::Graph ga(device(), [&] { default_group()->all_reduce(a)->wait(); });
  cuda::Graph gb(device(), [&] { default_group()->all_reduce(b)->wait(); });
  ga.replay();                             // a: S = n(n+1)/2 everywhere
  default_group()->all_reduce(b)->wait();  // b: 10 S
  gb.replay();                             // b: 10 n S
  ga.replay();                             // a: n S
  default_group()->all_reduce(a)->wait();  // a: n^2 S
  gb.replay();                             // b: 10 n^2 S
  const float sum = float(n * (n + 1) / 2);
  const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  for (int i = 0; i < 2; ++i) EXPECT_EQ(ha.data<float>()[i], float(n * n) * sum) << "rank " << r;
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(hb.data<float>()[i], 10.f * float(n * n) * sum) << "rank " << r;
  default_group()->barrier()->wait();
}

// What cannot be captured says so when the step would be: PowerSGD's state changes its tensors
// every iteration.
TEST_F(DdpCudaGraphs, AReducerThatCannotBeCapturedSaysWhy) {
  Generator gen(3);
  auto net = std::make_shared<Net>(gen);
  net->to(device());
  DdpOptions options;
  options.comm_hook = CommHook::powersgd;
  options.log = nullptr;
  DistributedDataParallel ddp(net, default_group(), options);
  EXPECT_NE(ddp.reducer().not_capturable().find("powersgd"), std::string::npos);
  const std::string e = testing::error_of([&] { ddp.reducer().ready_to_capture(); });
  EXPECT_NE(e.find("DDP: cannot capture an iteration into a CUDA graph: DDP's powersgd comm hook"),
            std::string::npos)
      << e;
  DdpOptions plain;
  plain.log = nullptr;
  DistributedDataParallel ok(net, default_group(), plain);
  EXPECT_EQ(ok.reducer().not_capturable(), "");
  EXPECT_FALSE(ok.reducer().ready_to_capture()) << "no iteration has run yet";
}

}  // namespace
}  // namespace rg::dist
