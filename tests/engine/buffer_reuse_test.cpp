// Buffer reuse: relu and add write over a temporary operand that nothing else holds, relu's
// backward over its incoming gradient, and backward's sums over a gradient only it holds; every
// other case (a kept handle, a saved tensor, a shared gradient) must get a fresh buffer.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "engine/ops/activation.h"
#include "engine/ops/binary.h"
#include "engine/ops/check.h"
#include "engine/ops/factory.h"
#include "engine/ops/reduce.h"
#include "engine/ops/unary.h"

namespace rg {
namespace {

Tensor vec(std::vector<double> v) { return from_vector<double>(v, {int64_t(v.size())}); }
Tensor leaf(std::vector<double> v) { return vec(std::move(v)).set_requires_grad(true); }
std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

TEST(BufferReuse, ReusableOnlyWhenNothingElseHoldsTheBuffer) {
  Tensor t = vec({1.0, 2.0});
  EXPECT_TRUE(reusable(t));
  Tensor copy = t;
  EXPECT_FALSE(reusable(t));  // a second handle
  copy = Tensor();
  Tensor alias = t.detach();
  EXPECT_FALSE(reusable(t));  // a second tensor on the storage (what SavedTensor holds)
  alias = Tensor();
  EXPECT_FALSE(reusable(vec({1.0, 2.0, 3.0}).narrow(0, 1, 2)));  // part of a larger storage
  EXPECT_FALSE(reusable(leaf({1.0})));                           // a leaf that requires grad
  EXPECT_TRUE(reusable(t));
}

TEST(BufferReuse, ReluAndAddWriteOverATemporaryOperand) {
  Tensor t = vec({-1.0, 2.0});
  const void* p = t.raw_data();
  Tensor y = relu(std::move(t));
  EXPECT_EQ(y.raw_data(), p);
  EXPECT_EQ(values(y), (std::vector<double>{0.0, 2.0}));
  Tensor z = add(std::move(y), vec({1.0, 1.0}));
  EXPECT_EQ(z.raw_data(), p);
  EXPECT_EQ(values(z), (std::vector<double>{1.0, 3.0}));
}

TEST(BufferReuse, AHeldOperandIsNeverOverwritten) {
  Tensor x = vec({-1.0, 2.0});
  Tensor kept = x;
  Tensor y = relu(std::move(x));
  EXPECT_NE(y.raw_data(), kept.raw_data());
  EXPECT_EQ(values(kept), (std::vector<double>{-1.0, 2.0}));
  Tensor a = vec({1.0, 2.0});
  Tensor a_kept = a;
  Tensor s = add(std::move(a), vec({10.0, 10.0}));
  EXPECT_NE(s.raw_data(), a_kept.raw_data());
  EXPECT_EQ(values(a_kept), (std::vector<double>{1.0, 2.0}));
  // A result larger than the operand (broadcast) cannot live in its buffer.
  Tensor small = from_vector<double>({1.0}, {1});
  const void* p = small.raw_data();
  Tensor wide = add(std::move(small), vec({1.0, 2.0}));
  EXPECT_NE(wide.raw_data(), p);
  EXPECT_EQ(values(wide), (std::vector<double>{2.0, 3.0}));
}

TEST(BufferReuse, AnOperandSavedForBackwardIsNotOverwritten) {
  // mul saves both operands; relu must not write over h, which mul's backward reads.
  Tensor w = leaf({-1.0, 2.0});
  Tensor h = mul(w, w);  // saves w
  Tensor e = exp(w);     // saves its output e
  const void* pe = e.raw_data();
  Tensor y = relu(std::move(e));
  EXPECT_NE(y.raw_data(), pe);
  sum(add(y, h)).backward();
  EXPECT_NEAR(values(w.grad())[0], std::exp(-1.0) - 2.0, 1e-12);
  EXPECT_NEAR(values(w.grad())[1], std::exp(2.0) + 4.0, 1e-12);
}

TEST(BufferReuse, GradientsThroughInPlaceForwardAreExact) {
  // y = relu(2w + b), as a residual block's relu(add(bn(...), identity)).
  Tensor w = leaf({-1.0, 0.5, 3.0});
  Tensor b = leaf({1.0, -2.0, 1.0});
  Tensor y = relu(add(mul(w, 2.0), b));
  sum(mul(y, vec({1.0, 2.0, 3.0}))).backward();
  EXPECT_EQ(values(y), (std::vector<double>{0.0, 0.0, 7.0}));
  EXPECT_EQ(values(w.grad()), (std::vector<double>{0.0, 0.0, 6.0}));
  EXPECT_EQ(values(b.grad()), (std::vector<double>{0.0, 0.0, 3.0}));
}

TEST(BufferReuse, ReluBackwardLeavesAGradientAHookKeptIntact) {
  Tensor w = leaf({-1.0, 2.0});
  Tensor y = relu(mul(w, 1.0));
  Tensor kept;
  y.register_hook([&](const Tensor& g) { kept = g; });
  sum(mul(y, vec({5.0, 7.0}))).backward();
  EXPECT_EQ(values(kept), (std::vector<double>{5.0, 7.0}));  // not relu's masked 0, 7
  EXPECT_EQ(values(w.grad()), (std::vector<double>{0.0, 7.0}));
}

TEST(BufferReuse, BackwardSumsNeverWriteIntoAGradientSharedWithAnotherNode) {
  // s = p + q hands one buffer to both p and q; p's gradient then also receives exp's. Adding
  // into the shared buffer would give q exp's share as well.
  Tensor a = leaf({0.5, -1.0});
  Tensor p = mul(a, 3.0);
  Tensor q = mul(a, 5.0);
  Tensor e = exp(p);
  Tensor s = add(p, q);
  sum(add(e, s)).backward();
  const auto g = values(a.grad());
  for (size_t i = 0; i < g.size(); ++i) {
    const double ai = i == 0 ? 0.5 : -1.0;
    EXPECT_NEAR(g[i], 3.0 * (1.0 + std::exp(3.0 * ai)) + 5.0, 1e-12);
  }
}

}  // namespace
}  // namespace rg
