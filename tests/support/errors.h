// Test helpers for library errors: the message of an rg::Error, or a check that one is thrown
// with a message containing a fragment.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "kernels/error.h"

namespace rg::testing {

// The message of the rg::Error that f throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// f throws an rg::Error whose message contains `fragment`.
inline void expect_error(const std::function<void()>& f, const std::string& fragment) {
  const std::string msg = error_of(f);
  EXPECT_FALSE(msg.empty()) << "expected an rg::Error containing '" << fragment << "'";
  EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
}

}  // namespace rg::testing
