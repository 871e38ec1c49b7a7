// Fails a test that leaves stream-race reports behind (emu_race_listener.h).
#include "support/emu_race_listener.h"

#include <string>
#include <vector>

#include "kernels/emu/device_runtime.h"

namespace rg::testing {

namespace {

// The reports (the first few) as lines of a failure message.
std::string listed(const std::vector<std::string>& reports) {
  constexpr size_t kShown = 5;
  std::string out;
  for (size_t i = 0; i < reports.size() && i < kShown; ++i) out += "\n  " + reports[i];
  if (reports.size() > kShown) {
    out += "\n  ... and " + std::to_string(reports.size() - kShown) + " more";
  }
  return out;
}

}  // namespace

void EmuRaceListener::OnTestStart(const ::testing::TestInfo&) {
  // Reports made outside any test (a suite's SetUpTestSuite/TearDownTestSuite, static
  // initialization) would otherwise be charged to this test's own code.
  const std::vector<std::string> reports = emu::race_reports();
  if (reports.empty()) return;
  ADD_FAILURE() << reports.size() << " stream-race report(s) of the CUDA emulator were made "
                << "before this test started (outside any test):" << listed(reports);
  emu::clear_race_reports();
}

void EmuRaceListener::OnTestEnd(const ::testing::TestInfo& test) {
  const std::vector<std::string> reports = emu::race_reports();
  if (reports.empty()) return;
  // End events reach listeners in reverse order of registration, so this failure is charged to
  // the test before the default printer reports its result.
  ADD_FAILURE() << test.test_suite_name() << "." << test.name() << " ended with " << reports.size()
                << " stream-race report(s) of the CUDA emulator (a test that "
                << "expects races calls rg::emu::clear_race_reports() once it has checked them):"
                << listed(reports);
  emu::clear_race_reports();
}

void install_emu_race_listener() {
  ::testing::UnitTest::GetInstance()->listeners().Append(new EmuRaceListener);
}

}  // namespace rg::testing
