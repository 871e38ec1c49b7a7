// What a job must show after ringgrad-run --max-restarts 1 restarted it once because one rank was
// killed (RG_TEST_FAULT, the trainer's fault injection): it succeeded, it reported the failure and
// the restart, and (when `resumes`) the new workers continued from the snapshot.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "support/processes.h"

namespace rg::testing {

inline void expect_restarted_once(const ProcessResult& faulted, bool resumes = true) {
  EXPECT_EQ(faulted.exit_code, 0) << faulted.out;
  // ringgrad-run reports the first failure it sees: the kill, or a peer that a collective with
  // the killed rank failed first (it exits with code 1).
  EXPECT_TRUE(faulted.out.find("was killed by SIGKILL") != std::string::npos ||
              faulted.out.find("exited with code 1; stopping") != std::string::npos)
      << faulted.out;
  EXPECT_NE(faulted.out.find("restarting the workers (restart 1 of 1)"), std::string::npos)
      << faulted.out;
  EXPECT_EQ(faulted.out.find("ringgrad-train: resumed from") != std::string::npos, resumes)
      << faulted.out;
}

}  // namespace rg::testing
