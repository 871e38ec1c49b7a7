// A GoogleTest listener for the emulated test executables: a test that ends with stream-race
// reports (rg::emu::race_reports()) fails, naming them, so a race found where nothing can throw
// (a free) or in RG_EMU_RACECHECK=warn mode does not pass unnoticed.
#pragma once

#include <gtest/gtest.h>

namespace rg::testing {

// Checks and clears the reports after every test (and before it, for reports made outside any
// test). A test that expects races (a mutation test) opts out by calling
// rg::emu::clear_race_reports() itself once it has checked them.
class EmuRaceListener : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo& test) override;
  void OnTestEnd(const ::testing::TestInfo& test) override;
};

// Appends an EmuRaceListener to the listeners of the test program (after InitGoogleTest).
void install_emu_race_listener();

}  // namespace rg::testing
