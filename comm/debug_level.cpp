// The process-wide debug level: an atomic read on every collective, set once at start.
#include "comm/debug_level.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <string>

#include "kernels/error.h"

namespace rg::dist {
namespace {

// -1: not decided yet (read RG_DISTRIBUTED_DEBUG on first use).
std::atomic<int> g_level{-1};

}  // namespace

DebugLevel parse_debug_level(std::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char ch) { return char(std::toupper(ch)); });
  if (upper == "OFF" || upper.empty()) return DebugLevel::off;
  if (upper == "INFO") return DebugLevel::info;
  if (upper == "DETAIL") return DebugLevel::detail;
  RG_FAIL("unknown distributed debug level '", name, "' (expected OFF, INFO or DETAIL)");
}

const char* debug_level_name(DebugLevel level) {
  switch (level) {
    case DebugLevel::off:
      return "OFF";
    case DebugLevel::info:
      return "INFO";
    case DebugLevel::detail:
      return "DETAIL";
  }
  return "?";
}

DebugLevel debug_level() {
  int v = g_level.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("RG_DISTRIBUTED_DEBUG");
    int parsed = int(env ? parse_debug_level(env) : DebugLevel::off);
    if (g_level.compare_exchange_strong(v, parsed)) v = parsed;
  }
  return DebugLevel(v);
}

void set_debug_level(DebugLevel level) { g_level.store(int(level)); }

}  // namespace rg::dist
