// f64 gradient checks for views (view, narrow) and clone, which are Tensor methods rather than
// ops of the op table (tests/ops/op_table.cpp holds every op's gradient checks).
#include <gtest/gtest.h>

#include "engine/ops/binary.h"
#include "support/gradcheck.h"

namespace rg {
namespace {

using testing::gradcheck;
using testing::random_input;

TEST(Gradcheck, ViewNarrowClone) {
  Generator gen(11);
  Tensor a = random_input({4, 3}, gen);
  EXPECT_EQ(gradcheck([](auto& x) { return x[0].view({2, 6}); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return x[0].narrow(0, 1, 2); }, {a}), "");
  EXPECT_EQ(gradcheck([](auto& x) { return mul(x[0].clone(), x[0]); }, {a}), "");
}

}  // namespace
}  // namespace rg
