// Conversions between the store's byte values and strings (the values are often text: numbers
// written by add(), addresses, NCCL ids encoded by the caller).
#include "comm/store.h"

#include <charconv>

namespace rg::dist {

Bytes to_bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }

std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

std::optional<int64_t> parse_store_int(const Bytes& b) {
  const char* first = reinterpret_cast<const char*>(b.data());
  const char* last = first + b.size();
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(first, last, v);
  if (b.empty() || ec != std::errc() || ptr != last) return std::nullopt;
  return v;
}

}  // namespace rg::dist
