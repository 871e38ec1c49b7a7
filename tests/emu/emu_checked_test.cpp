// Tests of the emulator's checked build (rg_emu_checked_tests, label emu): an out-of-bounds access
// to static or dynamic shared memory is reported by the sanitizers and stops the process.
#include <gtest/gtest.h>

#include <vector>

#include "emu/selftest_kernels.h"
#include "kernels/emu/launch.h"

// LeakSanitizer needs ptrace, which some CI containers forbid; leaks are not what this tests.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }

namespace rg::emu_test {
namespace {

class EmuCheckedDeathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(rg::emu::checked_build()) << "built without RG_EMU_CHECKED";
    // The emulator's worker threads exist already: run the child as a fresh process.
    GTEST_FLAG_SET(death_test_style, "threadsafe");
  }
};

TEST_F(EmuCheckedDeathTest, InBoundsAccessesAreNotReported) {
  for (OobKind kind : {OobKind::kStaticIndex, OobKind::kStaticPointer, OobKind::kDynamic}) {
    std::vector<float> out(64, 0.0f);
    shared_out_of_bounds(kind, out.data(), 0);
    for (float v : out) EXPECT_EQ(v, 1.0f);
  }
}

// s[threadIdx.x + 1] on a `__shared__ float s[64]`: -fsanitize=bounds checks every indexing of
// an array with a known bound, whatever its storage (also thread_local and template statics).
TEST_F(EmuCheckedDeathTest, StaticSharedIndexPastTheEndIsReported) {
  std::vector<float> out(64);
  EXPECT_DEATH(shared_out_of_bounds(OobKind::kStaticIndex, out.data(), 1),
               "index 64 out of bounds for type 'float \\[64\\]'");
}

// The same access through a pointer: AddressSanitizer's redzone after the static array. (GCC
// instruments statics of non-template kernels in an anonymous namespace, as ours are; it does
// not instrument thread_local ones, hence plain statics in the checked build.)
TEST_F(EmuCheckedDeathTest, StaticSharedPointerPastTheEndIsReported) {
  std::vector<float> out(64);
  EXPECT_DEATH(shared_out_of_bounds(OobKind::kStaticPointer, out.data(), 1),
               "AddressSanitizer: global-buffer-overflow");
}

// Dynamic shared memory is a heap block of exactly the launch's size in the checked build.
TEST_F(EmuCheckedDeathTest, DynamicSharedPastTheEndIsReported) {
  std::vector<float> out(64);
  EXPECT_DEATH(shared_out_of_bounds(OobKind::kDynamic, out.data(), 1),
               "AddressSanitizer: heap-buffer-overflow");
}

}  // namespace
}  // namespace rg::emu_test
