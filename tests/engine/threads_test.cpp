// rg::set_num_threads/num_threads: the public thread count is the one the CPU kernels use.
#include "engine/threads.h"

#include <gtest/gtest.h>

#include <atomic>

#include "kernels/cpu/parallel.h"
#include "kernels/error.h"

namespace rg {
namespace {

TEST(Threads, SetNumThreadsSetsTheCountTheKernelsUse) {
  const int before = num_threads();
  EXPECT_GT(before, 0);
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
  EXPECT_EQ(kernels::cpu::num_threads(), 3);
  std::atomic<int> chunks{0};
  kernels::cpu::parallel_for(0, 1000, 1, [&](int64_t, int64_t) { ++chunks; });
  EXPECT_EQ(chunks.load(), 3);  // one chunk per thread
  set_num_threads(1);
  EXPECT_EQ(kernels::cpu::num_threads(), 1);
  EXPECT_THROW(set_num_threads(0), Error);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(before);
}

}  // namespace
}  // namespace rg
