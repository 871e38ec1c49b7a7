// Out-of-line throw so that RG_CHECK expands to little code at each call site.
#include "kernels/error.h"

namespace rg::detail {
void throw_error(const std::string& message) { throw Error(message); }
}  // namespace rg::detail
