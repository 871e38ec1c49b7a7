// Uneven inputs (dist::Join) and static_graph across real processes (label dist, started by
// ringgrad-run at 2, 3 and 4 ranks): built into rg_dist_tests (gloo) and rg_emu_dist_tests (the
// module on the emulated device; emulated NCCL with RG_TEST_BACKEND=nccl).
//   - Join: rank r has kSteps - r batches of its own constant data. Every step's averaged
//     gradient on the ranks still active equals the mean of the active ranks' gradients computed
//     in one process (or the sum over the world size with divide_by_initial_world_size); the
//     joined ranks step on the averages they receive, so after the context every rank holds the
//     parameters of the one-process reference.
//   - Without Join the rank that ran out is named on every rank, with the iteration, well before
//     the group timeout, both when the ranks announce their last batch (no extra collective) and
//     when the early rank only calls end_of_data() after its loop.
//   - static_graph: the same parameters as the default path (bitwise), as find_unused_parameters
//     with an unused layer, and with a reentrant checkpoint (hooks firing twice) the parameters of
//     one process with the whole batch.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "comm/ddp.h"
#include "comm/init.h"
#include "comm/join.h"
#include "dist/ddp_test_net.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "layers/linear.h"
#include "layers/optim/optimizer.h"
#include "support/errors.h"
#include "support/parameter_difference.h"

namespace rg::dist {
namespace {

using testnet::kHidden;
using testnet::kIn;
using testnet::Net;
using Clock = std::chrono::steady_clock;
constexpr int64_t kBatch = 4;
constexpr double kLr = 0.1;
// f32 gradients summed in another order than the one-process reference: agreement to rounding.
constexpr double kTolerance = 1e-5;
// Every error must come well before the tests' 60 s group timeout.
constexpr double kNoHangSeconds = 20;

Device group_device() { return default_group()->tensor_device(); }

// Rank r's data: its own inputs and targets, the same in every step (so that the gradient of a
// rank depends only on the parameters).
struct RankData {
  Tensor x, y;
  explicit RankData(int r) {
    Generator g(uint64_t(100 + r));
    x = rand({kBatch, kIn}, g).to(group_device());
    y = rand({kBatch, kHidden}, g).to(group_device());
  }
};

Tensor loss_of(const Tensor& out, const RankData& d) { return mse_loss(out, d.y); }

std::vector<double> flat_grads(nn::Module& net) {
  std::vector<double> out;
  for (const Tensor& p : net.parameters()) {
    // No gradient (an unused parameter) counts as zeros.
    const auto v = p.grad().defined() ? p.grad().to(DType::f64).to_vector<double>()
                                      : std::vector<double>(size_t(p.numel()), 0.0);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

// The one-process reference of one step: the gradient of each of `ranks`' data at the current
// parameters, their sum divided by `divisor`.
std::vector<double> reference_gradient(Net& net, const std::vector<int>& ranks, double divisor) {
  std::vector<double> sum;
  for (int r : ranks) {
    net.zero_grad();
    loss_of(net.forward(RankData(r).x), RankData(r)).backward();
    const auto g = flat_grads(net);
    if (sum.empty()) sum.assign(g.size(), 0);
    for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
  }
  for (double& v : sum) v /= divisor;
  return sum;
}

// Writes `grad` into net's .grad (the reference's step).
void set_grads(Net& net, const std::vector<double>& grad) {
  size_t at = 0;
  for (const Tensor& p : net.parameters()) {
    const auto n = size_t(p.numel());
    std::vector<double> part(grad.begin() + long(at), grad.begin() + long(at + n));
    p.set_grad(from_vector(part, p.shape()).to(p.dtype()).to(p.device()));
    at += n;
  }
}

int steps_of(int rank) { return default_group()->size() + 1 - rank; }

void join_run(bool divide_by_initial_world_size, DdpOptions options = {},
              Net::Mode mode = Net::Mode::normal) {
  const int rank = default_group()->rank(), world = default_group()->size();
  auto net = std::make_shared<Net>();
  net->mode = mode;
  net->to(group_device());
  auto reference = std::make_shared<Net>();  // the same seed: DDP's rank-0 parameters
  reference->mode = mode;
  reference->to(group_device());
  DistributedDataParallel ddp(net, default_group(), options);
  optim::Sgd opt(net->parameters(), {.lr = kLr});
  optim::Sgd ref_opt(reference->parameters(), {.lr = kLr});
  const RankData mine(rank);
  const int most = steps_of(0);
  // The joined rank steps on the averages it receives (as ringgrad-train does), so its
  // parameters and optimizer state stay those of the others.
  CallbackJoinable stepper([&](const JoinRound& round) {
    if (round.sync) opt.step();
    opt.zero_grad();
  });
  int64_t shadowed = -1;
  {
    Join join({&ddp, &stepper}, default_group(),
              {.divide_by_initial_world_size = divide_by_initial_world_size});
    for (int step = 0; step < steps_of(rank); ++step) {
      opt.zero_grad();
      loss_of(ddp(mine.x), mine).backward();
      std::vector<int> active;
      for (int r = 0; r < world; ++r)
        if (step < steps_of(r)) active.push_back(r);
      const auto expected = reference_gradient(
          *reference, active, divide_by_initial_world_size ? world : double(active.size()));
      EXPECT_LT(max_abs_diff(flat_grads(*net), expected), kTolerance)
          << "step " << step << ", " << active.size() << " active ranks";
      opt.step();
      set_grads(*reference, expected);
      ref_opt.step();
    }
    opt.zero_grad();
    shadowed = join.finish();
  }
  EXPECT_EQ(shadowed, most - steps_of(rank)) << "rounds this rank shadowed";
  // The reference's remaining steps (only the ranks with more batches).
  for (int step = steps_of(rank); step < most; ++step) {
    std::vector<int> active;
    for (int r = 0; r < world; ++r)
      if (step < steps_of(r)) active.push_back(r);
    set_grads(*reference,
              reference_gradient(*reference, active,
                                 divide_by_initial_world_size ? world : double(active.size())));
    ref_opt.step();
  }
  EXPECT_LT(testing::relative_parameter_difference(*net, *reference), kTolerance);
  // After the context the ranks are in step: an even iteration succeeds everywhere.
  EXPECT_EQ(testing::error_of([&] { loss_of(ddp(mine.x), mine).backward(); }), "");
}

TEST(DdpJoin, UnevenBatchesEndWithoutHangAveragedOverTheActiveRanks) {
  const auto start = Clock::now();
  join_run(false);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), kNoHangSeconds);
}

TEST(DdpJoin, DivideByInitialWorldSizeAsPyTorchsDefault) { join_run(true); }

// The joined ranks also shadow the unused-parameter all-reduce (find_unused_parameters) and the
// first iteration's used-flags gather and delayed buckets (static_graph), hooks firing twice
// included.
TEST(DdpJoin, WithFindUnusedParametersAndStaticGraph) {
  DdpOptions find;
  find.find_unused_parameters = true;
  DdpOptions fixed;
  fixed.static_graph = true;
  join_run(false, find, Net::Mode::skip_fc2);
  join_run(false, fixed, Net::Mode::skip_fc2);
  join_run(false, fixed, Net::Mode::reentrant);
}

// A layer with a buffer that each training forward moves by its rank's own amount, as batch
// norm's running statistics follow each rank's own batches.
class Tally : public nn::Module {
 public:
  explicit Tally(int rank) : step_(double(rank + 1)) {
    Generator g(5);
    fc = register_module("fc", std::make_shared<nn::Linear>(kIn, kHidden, g));
    register_buffer("count", zeros({1}, DType::f32));
  }
  Tensor forward_impl(const Tensor& x) override {
    {
      NoGradGuard no_grad;
      Tensor count = named_buffers().front().second;
      count.fill_(count.item() + step_);
    }
    return fc->forward(x);
  }
  std::string type_name() const override { return "Tally"; }
  double count() { return named_buffers().front().second.item(); }
  std::shared_ptr<nn::Linear> fc;

 private:
  double step_;
};

TEST(DdpJoin, BuffersComeFromTheHighestActiveRankAndFinallyFromTheLastToJoin) {
  const int rank = default_group()->rank(), world = default_group()->size();
  auto net = std::make_shared<Tally>(rank);
  net->to(group_device());
  DistributedDataParallel ddp(net);
  const RankData mine(rank);
  // What every rank's buffer holds, simulated: before each forward the highest active rank's
  // value is broadcast (lower ranks may have joined with stale buffers; here rank 0 has the most
  // data, so the highest active rank is not rank 0 until the others have joined), then each
  // active rank adds its own amount.
  std::vector<double> counts(size_t(world), 0.0);
  const auto simulate = [&](int step) {
    int top = 0;
    for (int r = 0; r < world; ++r)
      if (step < steps_of(r)) top = r;
    const double broadcast = counts[size_t(top)];
    for (int r = 0; r < world; ++r)
      counts[size_t(r)] = broadcast + (step < steps_of(r) ? r + 1 : 0);
  };
  {
    CallbackJoinable none([](const JoinRound&) {});
    Join join({&ddp, &none}, default_group());
    for (int step = 0; step < steps_of(rank); ++step) {
      simulate(step);
      net->zero_grad();
      loss_of(ddp(mine.x), mine).backward();
      EXPECT_EQ(net->count(), counts[size_t(rank)]) << "step " << step;
    }
    join.finish();
  }
  for (int step = steps_of(rank); step < steps_of(0); ++step) simulate(step);
  // The post hook: the model and buffers of rank 0, the only rank that never shadowed a round.
  EXPECT_EQ(net->count(), counts[0]);
}

// Rank world-1 has one batch fewer than the others, and no Join.
std::string error_without_join(bool announce, DdpOptions options = {}) {
  const int rank = default_group()->rank(), world = default_group()->size();
  auto net = std::make_shared<Net>();
  net->to(group_device());
  DistributedDataParallel ddp(net, default_group(), options);
  const RankData mine(rank);
  const int steps = rank == world - 1 ? 2 : 3;
  const auto start = Clock::now();
  const std::string e = testing::error_of([&] {
    for (int step = 0; step < steps; ++step) {
      if (announce && step + 1 == steps) ddp.announce_last_iteration();
      net->zero_grad();
      loss_of(ddp(mine.x), mine).backward();
    }
    ddp.end_of_data();
  });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), kNoHangSeconds);
  if (rank == 0) std::cout << "message: " << e << "\n";
  // The group is still in step after the error.
  EXPECT_EQ(testing::error_of([&] { loss_of(ddp(mine.x), mine).backward(); }), "");
  return e;
}

std::string others_than_last() {
  const int n = default_group()->size();
  std::string s = n == 2 ? "rank 0" : "ranks 0";
  for (int r = 1; r < n - 1; ++r) s += ", " + std::to_string(r);
  return s;
}

void expect_all_in(const std::string& e, const std::vector<std::string>& parts) {
  for (const auto& part : parts) EXPECT_NE(e.find(part), std::string::npos) << part << "\n" << e;
}

std::string last_rank() { return "rank " + std::to_string(default_group()->size() - 1); }

TEST(DdpJoin, WithoutJoinTheRankThatRanOutIsNamedAtItsEndOfData) {
  expect_all_in(
      error_without_join(false),
      {"reduction could not finish in iteration 3",
       last_rank() + ": ran out of data (no batch for iteration 3, its last was iteration 2)",
       others_than_last() + ": had a batch for iteration 3", "dist::Join", "--join"});
}

// The out-of-data rank's end_of_data runs the collectives of a normal iteration (the used-flags
// all-reduce of find_unused_parameters, static_graph's first-iteration gather) while the others
// train their last iteration: the statuses are read one iteration late, so both must line up.
TEST(DdpJoin, WithoutJoinTheRankThatRanOutIsNamedWithFindUnusedParametersOrStaticGraph) {
  for (const bool static_graph : {false, true}) {
    DdpOptions o;
    o.find_unused_parameters = !static_graph;
    o.static_graph = static_graph;
    expect_all_in(error_without_join(false, o),
                  {"reduction could not finish in iteration 3",
                   last_rank() + ": ran out of data (no batch for iteration 3, its last was "
                                 "iteration 2)",
                   others_than_last() + ": had a batch for iteration 3"});
  }
}

TEST(DdpJoin, WithoutJoinAnAnnouncedLastBatchIsComparedInItsBackward) {
  expect_all_in(error_without_join(true),
                {"reduction could not finish in iteration 2",
                 last_rank() + ": ran out of data (its last batch was iteration 2)",
                 others_than_last() + ": had more batches after iteration 2"});
}

TEST(DdpJoin, EvenDataEndsWithoutErrorAnnouncedOrNot) {
  for (bool announce : {true, false}) {
    auto net = std::make_shared<Net>();
    net->to(group_device());
    DistributedDataParallel ddp(net);
    const RankData mine(default_group()->rank());
    EXPECT_EQ(testing::error_of([&] {
                for (int step = 0; step < 3; ++step) {
                  if (announce && step == 2) ddp.announce_last_iteration();
                  net->zero_grad();
                  loss_of(ddp(mine.x), mine).backward();
                }
                const auto before = flat_grads(*net);
                ddp.end_of_data();
                // The unannounced end runs one iteration of zeros and writes nothing back.
                EXPECT_EQ(max_abs_diff(flat_grads(*net), before), 0.0);
              }),
              "")
        << "announce " << announce;
  }
}

// `steps` SGD steps of DDP with `o` on rank-specific data, the net in `mode`.
std::shared_ptr<Net> trained(DdpOptions o, Net::Mode mode, int steps) {
  auto net = std::make_shared<Net>();
  net->mode = mode;
  net->to(group_device());
  DistributedDataParallel ddp(net, default_group(), o);
  optim::Sgd opt(net->parameters(), {.lr = kLr});
  const RankData mine(default_group()->rank());
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    loss_of(ddp(mine.x), mine).backward();
    opt.step();
  }
  return net;
}

DdpOptions static_graph() {
  DdpOptions o;
  o.static_graph = true;
  return o;
}

TEST(DdpStaticGraph, SameParametersAsTheDefaultPathBitwise) {
  // The same buckets after the rebuild and the same sums: nothing may differ, not even rounding.
  auto a = trained({}, Net::Mode::normal, 4);
  auto b = trained(static_graph(), Net::Mode::normal, 4);
  EXPECT_EQ(testing::relative_parameter_difference(*a, *b), 0.0);
}

TEST(DdpStaticGraph, UnusedParametersAsFindUnusedParameters) {
  DdpOptions find;
  find.find_unused_parameters = true;
  auto a = trained(find, Net::Mode::skip_fc2, 4);
  auto b = trained(static_graph(), Net::Mode::skip_fc2, 4);
  // static_graph rebuilds its buckets, find_unused_parameters does not: the ring sums in other
  // chunks, so the two agree to rounding.
  EXPECT_LT(testing::relative_parameter_difference(*a, *b), kTolerance);
  for (auto* n : {a.get(), b.get()})
    for (const auto& [name, p] : n->fc2->named_parameters())
      EXPECT_FALSE(p.grad().defined()) << name << ": an unused parameter keeps no gradient";
}

TEST(DdpStaticGraph, ReentrantCheckpointTrainsAsOneProcessWithTheWholeBatch) {
  const int world = default_group()->size();
  constexpr int kSteps = 3;
  auto net = trained(static_graph(), Net::Mode::reentrant, kSteps);
  // One process, every rank's data: the mean loss of equal batches is the mean of the ranks'.
  auto reference = std::make_shared<Net>();
  reference->mode = Net::Mode::reentrant;
  reference->to(group_device());
  optim::Sgd opt(reference->parameters(), {.lr = kLr});
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int> all;
    for (int r = 0; r < world; ++r) all.push_back(r);
    set_grads(*reference, reference_gradient(*reference, all, world));
    opt.step();
  }
  EXPECT_LT(testing::relative_parameter_difference(*net, *reference), kTolerance);
}

}  // namespace
}  // namespace rg::dist
