// rg::Error and the RG_CHECK/RG_FAIL macros: every library error is an rg::Error whose message
// says what is wrong in one line. Lives in kernels/, the bottom layer, so every layer can use it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace rg {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const std::string& message);
}  // namespace detail

}  // namespace rg

#define RG_CHECK(cond, ...)                                           \
  do {                                                                \
    if (!(cond)) [[unlikely]]                                         \
      ::rg::detail::throw_error(::rg::detail::cat(__VA_ARGS__));      \
  } while (0)

#define RG_FAIL(...) ::rg::detail::throw_error(::rg::detail::cat(__VA_ARGS__))
