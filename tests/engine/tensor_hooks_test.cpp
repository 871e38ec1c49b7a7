// Tensor hooks (register_hook on leaves and non-leaves, replacement, order, removal) and
// retain_grad, against gradients worked out by hand.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "engine/ops/binary.h"
#include "engine/ops/factory.h"
#include "engine/ops/reduce.h"
#include "support/errors.h"

namespace rg {
namespace {

Tensor leaf(std::vector<double> v) {
  Tensor t = from_vector<double>(v, {int64_t(v.size())});
  t.set_requires_grad(true);
  return t;
}

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
  EXPECT_FALSE(h.grad().defined());  // not retained
}

TEST(TensorHooks, HooksRunInRegistrationOrderEachOnThePreviousResult) {
  Tensor x = leaf({1.0});
  x.register_hook([](const Tensor& g) { return add(g, 1.0); });  // 1 -> 2
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
  testing::expect_error([&] { sum(x).backward(); }, "a tensor hook returned [3] f64 for a "
                                                    "gradient of [2] f64");
}

}  // namespace
}  // namespace rg
