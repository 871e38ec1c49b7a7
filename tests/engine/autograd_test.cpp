// Autograd engine: diamond graphs, reused parameters, accumulation across backward calls, hook
// order, final callbacks, NoGradGuard, the errors users hit, tensor hooks and retain_grad.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "engine/autograd/engine.h"
#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/reduce.h"
#include "engine/ops/unary.h"
#include "kernels/error.h"
#include "support/errors.h"

namespace rg {
namespace {

Tensor leaf(std::vector<double> v) {
  Tensor t = from_vector<double>(v, {int64_t(v.size())});
  t.set_requires_grad(true);
  return t;
}

using testing::error_of;

TEST(Autograd, DiamondGraphSumsBothPaths) {
  // y = a*a + exp(a): dy/da = 2a + exp(a); both branches meet again at the add.
  Tensor a = leaf({0.5, -1.0});
  Tensor b = mul(a, a);
  Tensor c = exp(a);
  sum(add(b, c)).backward();
  const auto g = a.grad().to_vector<double>();
  EXPECT_NEAR(g[0], 2 * 0.5 + std::exp(0.5), 1e-12);
  EXPECT_NEAR(g[1], -2.0 + std::exp(-1.0), 1e-12);
}

TEST(Autograd, ParameterUsedTwiceGetsOneAccumulation) {
  // y = w*x + 2w: dy/dw = x + 2 = 4; the hook sees the complete gradient, exactly once.
  Tensor w = leaf({3.0});
  Tensor x = from_vector<double>({2.0}, {1});
  int hook_calls = 0;
  double seen = 0;
  w.register_post_accumulate_grad_hook([&](Tensor& t) {
    ++hook_calls;
    seen = t.grad().item();
  });
  sum(add(mul(w, x), mul(w, 2.0))).backward();
  EXPECT_EQ(hook_calls, 1);
  EXPECT_EQ(seen, 4.0);
  EXPECT_EQ(w.grad().item(), 4.0);
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCallsUntilZeroGrad) {
  Tensor w = leaf({1.0, 2.0});
  sum(mul(w, 3.0)).backward();
  sum(mul(w, 3.0)).backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{6.0, 6.0}));
  w.zero_grad(/*set_to_none=*/false);
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{0.0, 0.0}));
  w.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  sum(w).backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{1.0, 1.0}));
}

TEST(Autograd, HooksFireOncePerBackwardInReverseOrderOfUse) {
  // A chain p0 -> p1 -> p2 like layers of a network: gradients become ready last layer first.
  std::vector<Tensor> params = {leaf({1.0}), leaf({2.0}), leaf({3.0})};
  std::vector<int> order;
  for (int i = 0; i < 3; ++i) {
    params[size_t(i)].register_post_accumulate_grad_hook(
        [&order, i](Tensor&) { order.push_back(i); });
  }
  for (int iter = 0; iter < 2; ++iter) {
    order.clear();
    Tensor x = from_vector<double>({0.1}, {1});
    Tensor act = x;
    for (auto& p : params) act = exp(mul(act, p));
    sum(act).backward();
    EXPECT_EQ(order, (std::vector<int>{2, 1, 0})) << "iteration " << iter;
  }
}

TEST(Autograd, FinalCallbacksRunAfterEveryHook) {
  Tensor a = leaf({1.0});
  Tensor b = leaf({2.0});
  std::vector<std::string> events;
  auto hook = [&](const char* name) {
    return [&events, name](Tensor&) {
      events.push_back(name);
      if (events.size() == 1) {
        autograd::Engine::queue_callback([&events] {
          events.push_back("callback");
          // A callback may queue another one; it runs in the same pass.
          autograd::Engine::queue_callback([&events] { events.push_back("nested"); });
        });
      }
    };
  };
  a.register_post_accumulate_grad_hook(hook("a"));
  b.register_post_accumulate_grad_hook(hook("b"));
  sum(mul(a, b)).backward();
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2], "callback");
  EXPECT_EQ(events[3], "nested");
  EXPECT_FALSE(autograd::Engine::in_backward());
  EXPECT_NE(error_of([] { autograd::Engine::queue_callback([] {}); }).find("backward"),
            std::string::npos);
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor a = leaf({1.0});
  Tensor y;
  {
    NoGradGuard guard;
    y = mul(a, 2.0);
    EXPECT_FALSE(GradMode::is_enabled());
  }
  EXPECT_TRUE(GradMode::is_enabled());
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_NE(error_of([&] { sum(y).backward(); }).find("does not require grad"), std::string::npos);
}

TEST(Autograd, NonScalarRootNeedsExplicitGradient) {
  Tensor a = leaf({1.0, 2.0});
  Tensor y = mul(a, 3.0);
  EXPECT_NE(error_of([&] { y.backward(); }).find("scalar"), std::string::npos);
  y.backward(from_vector<double>({1.0, 10.0}, {2}));
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{3.0, 30.0}));
  EXPECT_NE(error_of([&] { mul(a, 3.0).backward(ones({3}, DType::f64)); }).find("does not match"),
            std::string::npos);
}

TEST(Autograd, SecondBackwardThroughFreedGraphIsAnError) {
  Tensor a = leaf({1.0, 2.0});
  Tensor y = sum(exp(a));
  y.backward();
  const std::string msg = error_of([&] { y.backward(); });
  EXPECT_NE(msg.find("second time"), std::string::npos) << msg;
  EXPECT_NE(msg.find("retain_graph"), std::string::npos) << msg;
  // With retain_graph the second pass works and accumulates.
  Tensor b = leaf({0.0});
  Tensor z = sum(exp(b));
  z.backward(Tensor(), /*retain_graph=*/true);
  z.backward();
  EXPECT_NEAR(b.grad().item(), 2.0, 1e-12);
}

TEST(Autograd, WrongGradientShapeFromANodeIsAnError) {
  // A hand-written node that returns a gradient of the wrong shape.
  Tensor a = leaf({1.0, 2.0, 3.0});
  Tensor out = autograd::record(zeros({2}, DType::f64), "BrokenBackward", {a}, [](const Tensor&) {
    return std::vector<Tensor>{zeros({2}, DType::f64)};
  });
  const std::string msg = error_of([&] { sum(out).backward(); });
  EXPECT_NE(msg.find("BrokenBackward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
}

TEST(Autograd, ModifiedSavedTensorIsDetected) {
  Tensor a = leaf({1.0, 2.0});
  Tensor e = exp(a);  // saves its output
  Tensor y = sum(e);
  {
    NoGradGuard guard;
    Tensor alias = e.detach();
    mul_(alias, 2.0);
  }
  EXPECT_NE(error_of([&] { y.backward(); }).find("modified by an in-place operation"),
            std::string::npos);
}

TEST(Autograd, InPlaceUpdateOfLeafNeedsNoGrad) {
  Tensor w = leaf({1.0});
  EXPECT_NE(error_of([&] { add_(w, ones({1}, DType::f64)); }).find("NoGradGuard"),
            std::string::npos);
  NoGradGuard guard;
  add_(w, ones({1}, DType::f64), -0.5);
  EXPECT_EQ(w.item(), 0.5);
}

TEST(Autograd, LatestCreatedReadyNodeRunsFirst) {
  // Two independent branches from different leaves: the branch created later finishes first.
  Tensor a = leaf({1.0});
  Tensor b = leaf({1.0});
  std::vector<char> order;
  a.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back('a'); });
  b.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back('b'); });
  Tensor ya = exp(mul(a, 2.0));
  Tensor yb = exp(mul(b, 2.0));
  sum(add(ya, yb)).backward();
  EXPECT_EQ(order, (std::vector<char>{'b', 'a'}));
}

// A leaf's first gradient becomes .grad without a copy when backward alone holds it, and is
// copied whenever anyone else can still see it.

TEST(Autograd, LeafAdoptsAGradientThatOnlyBackwardHolds) {
  Tensor x = leaf({1.0, -2.0});
  const void* seen = nullptr;
  x.register_hook([&](const Tensor& g) { seen = g.raw_data(); });  // observes, keeps nothing
  sum(mul(x, 3.0)).backward();
  EXPECT_EQ(x.grad().raw_data(), seen);
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3.0, 3.0}));
}

TEST(Autograd, GradientSharedByTwoLeavesIsCopiedForOne) {
  // add's backward hands the same buffer to both leaves: at most one of them may keep it.
  Tensor a = leaf({1.0, 2.0});
  Tensor b = leaf({3.0, 4.0});
  sum(mul(add(a, b), 2.0)).backward();
  EXPECT_NE(a.grad().raw_data(), b.grad().raw_data());
  sum(mul(a, 5.0)).backward();  // accumulates in place into a.grad only
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{7.0, 7.0}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{2.0, 2.0}));
}

TEST(Autograd, GradientAHookKeepsIsCopied) {
  Tensor x = leaf({1.0, -2.0});
  Tensor kept;
  x.register_hook([&](const Tensor& g) { kept = g; });
  sum(mul(x, 3.0)).backward();
  EXPECT_NE(x.grad().raw_data(), kept.raw_data());
  const Tensor first = kept;
  sum(mul(x, 1.0)).backward();  // accumulates into x.grad; what the hook kept must not change
  EXPECT_EQ(first.to_vector<double>(), (std::vector<double>{3.0, 3.0}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{4.0, 4.0}));
}

// Tensor hooks (register_hook on leaves and non-leaves: replacement, order, removal) and
// retain_grad, against gradients worked out by hand.

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

TEST(TensorHooks, LeafHookSeesTheGradientAndItsReplacementIsAccumulated) {
  // loss = sum(x * x): dloss/dx = 2x; the hook doubles it before it reaches x.grad.
  Tensor x = leaf({1.0, -2.0});
  std::vector<double> seen;
  x.register_hook([&](const Tensor& g) {
    seen = values(g);
    return mul(g, 2.0);
  });
  sum(mul(x, x)).backward();
  EXPECT_EQ(seen, (std::vector<double>{2.0, -4.0}));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{4.0, -8.0}));
}

TEST(TensorHooks, NonLeafHookReplacesTheGradientFlowingOnIntoTheGraph) {
  // h = 3x, loss = sum(h * h): dloss/dh = 2h = 6x; dloss/dx = 3 * (what the hook returns).
  Tensor x = leaf({1.0, 2.0});
  Tensor h = mul(x, 3.0);
  std::vector<double> seen;
  int calls = 0;
  h.register_hook([&](const Tensor& g) {  // only observes: returns nothing
    ++calls;
    seen = values(g);
  });
  h.register_hook([](const Tensor& g) -> std::optional<Tensor> { return add(g, 1.0); });
  sum(mul(h, h)).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<double>{6.0, 12.0}));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{21.0, 39.0}));  // 3 * (6x + 1)
  EXPECT_FALSE(h.grad().defined());                                // not retained
}

TEST(TensorHooks, HooksRunInRegistrationOrderEachOnThePreviousResult) {
  Tensor x = leaf({1.0});
  x.register_hook([](const Tensor& g) { return add(g, 1.0); });   // 1 -> 2
  x.register_hook([](const Tensor& g) { return mul(g, 10.0); });  // 2 -> 20
  sum(x).backward();
  EXPECT_EQ(x.grad().item(), 20.0);
}

TEST(TensorHooks, RemovedHooksNoLongerRun) {
  Tensor x = leaf({1.0});
  Tensor h = mul(x, 2.0);
  int leaf_calls = 0, non_leaf_calls = 0;
  RemovableHandle on_leaf = x.register_hook([&](const Tensor&) { ++leaf_calls; });
  RemovableHandle on_h = h.register_hook([&](const Tensor& g) {
    ++non_leaf_calls;
    return mul(g, 0.0);
  });
  sum(h).backward(Tensor(), /*retain_graph=*/true);
  EXPECT_EQ(leaf_calls, 1);
  EXPECT_EQ(non_leaf_calls, 1);
  EXPECT_EQ(x.grad().item(), 0.0);
  on_leaf.remove();
  on_h.remove();
  on_h.remove();  // twice is harmless
  sum(h).backward();
  EXPECT_EQ(leaf_calls, 1);
  EXPECT_EQ(non_leaf_calls, 1);
  EXPECT_EQ(x.grad().item(), 2.0);  // 0 + the unhooked 2
}

TEST(TensorHooks, RetainGradFillsANonLeafsGradAfterItsHooks) {
  Tensor x = leaf({1.0, 2.0});
  Tensor h = mul(x, 3.0);
  EXPECT_FALSE(h.retains_grad());
  h.retain_grad();
  // Registered after retain_grad, it still runs first: .grad holds the hooked gradient.
  h.register_hook([](const Tensor& g) { return mul(g, 2.0); });
  Tensor loss = sum(mul(h, h));  // dloss/dh = 2h = 6x
  loss.backward(Tensor(), /*retain_graph=*/true);
  EXPECT_TRUE(h.retains_grad());
  EXPECT_FALSE(h.is_leaf());
  EXPECT_EQ(values(h.grad()), (std::vector<double>{12.0, 24.0}));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{36.0, 72.0}));
  loss.backward();  // accumulates like a leaf's .grad
  EXPECT_EQ(values(h.grad()), (std::vector<double>{24.0, 48.0}));
  h.zero_grad();
  EXPECT_FALSE(h.grad().defined());

  // On a leaf retain_grad changes nothing, and retains_grad() stays false (as in PyTorch).
  x.retain_grad();
  EXPECT_FALSE(x.retains_grad());
}

TEST(TensorHooks, ErrorsNameTheProblem) {
  Tensor plain = from_vector<double>({1.0}, {1});
  testing::expect_error([&] { plain.register_hook([](const Tensor&) {}); },
                        "does not require grad");
  testing::expect_error([&] { plain.retain_grad(); }, "does not require grad");
  Tensor x = leaf({1.0, 2.0});
  x.register_hook([](const Tensor&) { return zeros({3}, DType::f64); });
  testing::expect_error([&] { sum(x).backward(); },
                        "a tensor hook returned [3] f64 for a "
                        "gradient of [2] f64");
}

}  // namespace
}  // namespace rg
