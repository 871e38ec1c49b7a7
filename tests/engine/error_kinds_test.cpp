// The two kinds of rg::Error (kernels/error.h): a user error (bad input, flag, file) is an
// rg::Error only; a broken invariant of ringgrad's own code is an rg::InternalError, which names
// its source line and asks for a report, and is still caught as an rg::Error.
#include <gtest/gtest.h>

#include <string>

#include "engine/ops/factory.h"
#include "engine/ops/loss.h"
#include "engine/tensor.h"
#include "kernels/error.h"
#include "kernels/loss.h"

namespace rg {
namespace {

TEST(ErrorKinds, BadUserInputIsAnErrorButNotAnInternalError) {
  const Tensor logits = zeros({2, 3}, DType::f32);
  Tensor target = zeros({2}, DType::i64);
  target.data<int64_t>()[1] = 7;
  try {
    cross_entropy(logits, target);
    FAIL() << "expected an rg::Error";
  } catch (const InternalError& e) {
    FAIL() << "a bad target is the caller's error, not a bug: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 7 at index 1 is out of range"), std::string::npos);
  }
}

TEST(ErrorKinds, ABrokenInvariantIsAnInternalErrorNamingItsLine) {
  // A kernel's caller handing it less workspace than it asked for is a bug in the caller.
  const float x[2] = {0.f, 1.f};
  const int64_t target[1] = {1};
  float lse[1], loss[1];
  int64_t bad[2];
  try {
    kernels::Loss<kernels::Cpu>::cross_entropy<float>(x, target, lse, loss, bad, 1, 2, 0.0,
                                                      kernels::Workspace{}, {});
    FAIL() << "expected an rg::InternalError";
  } catch (const InternalError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("internal error (a bug in ringgrad; please report it) at ", 0), 0u) << m;
    EXPECT_NE(m.find("kernels/loss.h:"), std::string::npos) << m;
    EXPECT_NE(m.find("needs a workspace of 8 bytes"), std::string::npos) << m;
  }
  // Still an rg::Error for code that catches every library error.
  EXPECT_THROW(RG_ASSERT(1 + 1 == 3, "arithmetic"), Error);
}

}  // namespace
}  // namespace rg
