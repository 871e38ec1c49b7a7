// DDP's diagnostics and the cross-rank consistency check across real processes (label dist,
// started by ringgrad-run at 2 and 3 ranks): built into rg_dist_tests (gloo) and
// rg_emu_dist_tests (the module on the emulated device; emulated NCCL with RG_TEST_BACKEND=nccl).
// A parameter without a gradient on one rank, a rank without any gradient and a parameter marked
// ready twice must each end in the same named error on every rank, quickly (no rank waits for a
// collective timeout), with the group still usable; the unused-parameter summary comes once, from
// rank 0; a weight or gradient perturbed on one rank is named with the ranks holding each hash.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <sstream>

#include "comm/consistency.h"
#include "comm/ddp.h"
#include "comm/debug_level.h"
#include "comm/init.h"
#include "dist/ddp_test_net.h"
#include "engine/autograd/engine.h"
#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "layers/linear.h"
#include "layers/models/registry.h"
#include "support/errors.h"

namespace rg::dist {
namespace {

using Clock = std::chrono::steady_clock;
using testnet::kIn;
using testnet::Net;
constexpr int64_t kBatch = 4;
// Every error here must come well before the tests' 60 s group timeout: a rank that waited for
// one would have hung without the diagnostics.
constexpr double kNoHangSeconds = 20;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Rig {
  std::shared_ptr<Net> net = std::make_shared<Net>();
  Tensor x, y;
  Rig() {
    const Device device = default_group()->tensor_device();
    net->to(device);
    Generator g(uint64_t(11 + default_group()->rank()));
    x = rand({kBatch, kIn}, g).to(device);
    y = from_vector<int64_t>({1, 3, 5, 7}, {kBatch}).to(device);
  }
  void step(DistributedDataParallel& ddp) const {
    net->zero_grad();
    cross_entropy(ddp(x), y).backward();
  }
};

// "rank 1" at 2 ranks, "ranks 0, 2" at 3: how the errors name the ranks other than rank 1.
std::string others_than_rank_one() {
  const int n = default_group()->size();
  std::string s = n == 2 ? "rank 0" : "ranks 0";
  for (int r = 2; r < n; ++r) s += ", " + std::to_string(r);
  return s;
}

// The message, printed once (rank 0) so that test logs show what users see.
std::string shown(const std::string& e) {
  if (default_group()->rank() == 0) std::cout << "message: " << e << "\n";
  return e;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// After an error, the group must be in step: an iteration with every parameter used succeeds.
void expect_group_still_in_step(Rig& s, DistributedDataParallel& ddp) {
  s.net->mode = Net::Mode::normal;
  EXPECT_EQ(rg::testing::error_of([&] { s.step(ddp); }), "");
  for (const auto& [name, p] : s.net->named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
}

// The error of one training iteration run by `iteration` on a fresh Net under DDP, which the next
// synchronized backward reports (DDP reads each iteration's status one iteration late, so that
// reading it never stalls the host; PyTorch too reports these at the next iteration): it must
// come well before any collective timeout, and leave the group in step.
std::string error_of_iteration(
    const std::function<void(Rig&, DistributedDataParallel&)>& iteration) {
  Rig s;
  DistributedDataParallel ddp(s.net);
  const auto start = Clock::now();
  const std::string e = shown(rg::testing::error_of([&] {
    iteration(s, ddp);
    s.step(ddp);
  }));
  EXPECT_LT(seconds_since(start), kNoHangSeconds);
  expect_group_still_in_step(s, ddp);
  return e;
}

// One step in which rank 1 runs `mode` and the others the normal net.
std::string error_when_rank_one_runs(Net::Mode mode) {
  return error_of_iteration([mode](Rig& s, DistributedDataParallel& ddp) {
    if (default_group()->rank() == 1) s.net->mode = mode;
    s.step(ddp);
  });
}

void expect_all_in(const std::string& e, const std::vector<std::string>& parts) {
  for (const auto& part : parts) EXPECT_NE(e.find(part), std::string::npos) << part << "\n" << e;
}

TEST(DdpDiagnostics, AParameterWithoutGradientOnOneRankIsNamedOnEveryRank) {
  expect_all_in(
      error_when_rank_one_runs(Net::Mode::skip_fc2),
      {"reduction could not finish in iteration 1", "rank 1: fc2.weight, fc2.bias got none",
       others_than_rank_one() + ": every parameter got one", "find_unused_parameters=true",
       "--find-unused-parameters"});
}

TEST(DdpDiagnostics, ARankThatSkippedItsBackwardIsNamedOnEveryRank) {
  // Rank 1 runs a training forward and never its backward: its next forward sends the buckets
  // that the other ranks wait for at the end of their backward, and the iteration after reports
  // it.
  const std::string e = error_of_iteration([](Rig& s, DistributedDataParallel& ddp) {
    const Tensor out = ddp(s.x);
    if (default_group()->rank() == 1)
      ddp(s.x);
    else
      cross_entropy(out, s.y).backward();
  });
  expect_all_in(
      e, {"rank 1: no parameter got one", others_than_rank_one() + ": every parameter got one"});
}

TEST(DdpDiagnostics, AParameterMarkedReadyTwiceIsNamedWithTheFix) {
  const std::string e = error_when_rank_one_runs(Net::Mode::reentrant);
  expect_all_in(
      e, {"marked ready twice", "rank 1: fc1.weight, fc1.bias", others_than_rank_one() + ": none",
          "reentrant", "static_graph=true", "--static-graph"});
  // No parameter went without a gradient, so that part stays out of the message.
  EXPECT_EQ(e.find("received no gradient"), std::string::npos) << e;
}

// Sets the debug level for one test.
struct DebugLevelScope {
  DebugLevel prev = debug_level();
  explicit DebugLevelScope(DebugLevel l) { set_debug_level(l); }
  ~DebugLevelScope() { set_debug_level(prev); }
};

// Two iterations with find_unused_parameters, rank 1 leaving fc2 out when `rank_one_skips`;
// returns what DDP logged.
std::string log_of_two_iterations(bool rank_one_skips) {
  Rig s;
  std::ostringstream log;
  DdpOptions o;
  o.find_unused_parameters = true;
  o.log = &log;
  DistributedDataParallel ddp(s.net, default_group(), o);
  if (rank_one_skips && default_group()->rank() == 1) s.net->mode = Net::Mode::skip_fc2;
  s.step(ddp);
  s.step(ddp);
  return log.str();
}

TEST(DdpDiagnostics, UnusedParameterSummaryAtInfoComesOnceFromRankZero) {
  const bool rank0 = default_group()->rank() == 0;
  {
    DebugLevelScope info(DebugLevel::info);
    const std::string log = log_of_two_iterations(true);
    if (rank0) {
      EXPECT_EQ(count_of(shown(log), "unused parameters in the first iteration"), 1u) << log;
      EXPECT_NE(log.find("rank 1: fc2.weight, fc2.bias unused"), std::string::npos) << log;
      EXPECT_NE(log.find(others_than_rank_one() + ": every parameter used"), std::string::npos)
          << log;
      EXPECT_EQ(log.find("Unused on every rank"), std::string::npos) << log;
    } else {
      EXPECT_EQ(log, "");
    }
  }
  DebugLevelScope off(DebugLevel::off);
  EXPECT_EQ(log_of_two_iterations(true), "") << "the summary is for INFO and DETAIL";
}

TEST(DdpDiagnostics, FindUnusedParametersWithNothingUnusedWarnsOnce) {
  DebugLevelScope off(DebugLevel::off);
  const std::string log = log_of_two_iterations(false);
  EXPECT_EQ(count_of(log, "no parameter was unused in the first iteration"),
            default_group()->rank() == 0 ? 1u : 0u)
      << log;
}

TEST(Consistency, IdenticalRanksPass) {
  Rig s;
  DistributedDataParallel ddp(s.net);  // rank 0's parameters everywhere
  for (int step = 1; step <= 2; ++step) {
    s.step(ddp);
    ConsistencyCheck check;
    check.add_gradients(s.net->named_parameters());
    check.add(s.net->state_dict());
    EXPECT_EQ(rg::testing::error_of([&] { check.run(*default_group(), step); }), "");
    EXPECT_EQ(check.size(), 0u) << "run() clears";
  }
}

// Adds 1e-3 to the first element of `t` (on any device).
void perturb(const Tensor& t) {
  NoGradGuard no_grad;
  Tensor first = t.flat_narrow(0, 1);
  first.fill_(first.item() + 1e-3);
}

std::string check_error(const ConsistencyCheck::NamedTensors& grads_of,
                        const ConsistencyCheck::NamedTensors& tensors, int64_t step) {
  ConsistencyCheck check;
  check.add_gradients(grads_of);
  check.add(tensors);
  return rg::testing::error_of([&] { check.run(*default_group(), step); });
}

TEST(Consistency, AWeightPerturbedOnOneRankIsNamedWithTheRanks) {
  Rig s;
  DistributedDataParallel ddp(s.net);
  s.step(ddp);
  if (default_group()->rank() == 1) perturb(s.net->fc1->named_parameters().front().second);
  const std::string e = shown(check_error({}, s.net->state_dict(), 40));
  EXPECT_NE(e.find("consistency check at step 40: fc1.weight differs between ranks"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("rank 1 has 0x"), std::string::npos) << e;
  EXPECT_NE(
      e.find(others_than_rank_one() + (default_group()->size() == 2 ? " has 0x" : " have 0x")),
      std::string::npos)
      << e;
  EXPECT_NE(e.find("the first of 1 differing"), std::string::npos) << e;
}

TEST(Consistency, AGradientThatDiffersIsNamedBeforeTheWeights) {
  Rig s;
  DistributedDataParallel ddp(s.net);
  s.step(ddp);
  if (default_group()->rank() == 1) perturb(s.net->fc0->named_parameters().back().second.grad());
  const std::string e = shown(check_error(s.net->named_parameters(), s.net->state_dict(), 7));
  EXPECT_NE(e.find("step 7: fc0.bias.grad differs between ranks"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1 has 0x"), std::string::npos) << e;
  // Without the gradients (ringgrad-train below DETAIL) the same ranks agree.
  EXPECT_EQ(check_error({}, s.net->state_dict(), 7), "");
}

// One element changes the hash, a copy does not; and what a check costs for ToyNet and ResNet-18
// (printed: the cost of --check-consistency).
TEST(Consistency, HashSeesOneElementAndTheCostPerCheckIsPrinted) {
  const Device device = default_group()->tensor_device();
  for (const char* name : {"toynet", "resnet18"}) {
    const bool cifar = std::string(name) == "resnet18";
    auto model = nn::make_model({.name = name,
                                 .sample_shape = cifar ? Shape{3, 32, 32} : Shape{1, 28, 28},
                                 .num_classes = 10,
                                 .seed = 3});
    model->to(device);
    const auto state = model->state_dict();
    size_t bytes = 0;
    for (const auto& [n, t] : state) bytes += t.nbytes();
    const Tensor w = state.front().second;
    const uint64_t before = tensor_hash(w);
    EXPECT_EQ(tensor_hash(w.clone()), before);
    const Tensor changed = w.clone();
    perturb(changed);
    EXPECT_NE(tensor_hash(changed), before);
    ConsistencyCheck warm;
    warm.add(state);
    warm.run(*default_group(), 0);
    constexpr int kRuns = 5;
    double hash_s = 0, total_s = 0;
    for (int i = 0; i < kRuns; ++i) {
      ConsistencyCheck check;
      const auto t0 = Clock::now();
      check.add(state);
      hash_s += seconds_since(t0);
      check.run(*default_group(), 0);
      total_s += seconds_since(t0);
    }
    if (default_group()->rank() == 0)
      std::cout << "consistency check, " << name << " on " << device.str() << ", " << state.size()
                << " tensors, " << double(bytes) / 1e6 << " MB, " << default_group()->size()
                << " ranks: " << 1e3 * total_s / kRuns << " ms per check (hashing "
                << 1e3 * hash_s / kRuns << " ms)\n";
  }
}

}  // namespace
}  // namespace rg::dist
