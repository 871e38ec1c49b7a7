// rg::Error and the RG_CHECK/RG_FAIL macros: every library error is an rg::Error whose message
// says what is wrong in one line. Lives in kernels/, the bottom layer, so every layer can use it.
//
// Two kinds, told apart by type:
//   - rg::Error (RG_CHECK, RG_FAIL): the caller's input, a flag, a file, a network peer or the
//     environment is wrong; the message says what to change.
//   - rg::InternalError (RG_ASSERT), derived from rg::Error so one catch still handles both: an
//     invariant of ringgrad itself does not hold, which only a bug in ringgrad can cause. Its
//     message starts with "internal error" and names the source line; the programs report it as
//     a bug (exit status 70, EX_SOFTWARE) rather than as a usage error (1).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace rg {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const std::string& message);
[[noreturn]] void throw_internal_error(const char* file, int line, const std::string& message);
}  // namespace detail

}  // namespace rg

#define RG_CHECK(cond, ...)                                           \
  do {                                                                \
    if (!(cond)) [[unlikely]]                                         \
      ::rg::detail::throw_error(::rg::detail::cat(__VA_ARGS__));      \
  } while (0)

#define RG_FAIL(...) ::rg::detail::throw_error(::rg::detail::cat(__VA_ARGS__))

// An invariant of ringgrad's own code (not a check of the caller's input: use RG_CHECK for that).
#define RG_ASSERT(cond, ...)                                                                   \
  do {                                                                                         \
    if (!(cond)) [[unlikely]]                                                                  \
      ::rg::detail::throw_internal_error(__FILE__, __LINE__,                                   \
                                         ::rg::detail::cat(#cond __VA_OPT__(, ": ", ) __VA_ARGS__)); \
  } while (0)
