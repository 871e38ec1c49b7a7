// Out-of-line throw so that RG_CHECK expands to little code at each call site.
#include "kernels/error.h"

namespace rg::detail {
void throw_error(const std::string& message) { throw Error(message); }

void throw_internal_error(const char* file, int line, const std::string& message) {
  throw InternalError(cat("internal error (a bug in ringgrad; please report it) at ", file, ":",
                          line, ": ", message));
}
}  // namespace rg::detail
