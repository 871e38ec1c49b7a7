// The distributed debug level, as PyTorch's TORCH_DISTRIBUTED_DEBUG: RG_DISTRIBUTED_DEBUG=OFF |
// INFO | DETAIL (ringgrad-train's --debug-distributed sets it for the process).
//   OFF     the default: the flight recorder (always on) and the errors every run has.
//   INFO    adds reports that cost nothing per step (DDP's unused-parameter summary, ...).
//   DETAIL  checks every collective's fingerprint across ranks before it runs
//           (comm/debug_group.h) and hashes DDP's averaged gradients in consistency checks.
#pragma once

#include <string_view>

namespace rg::dist {

enum class DebugLevel { off, info, detail };

// "OFF" | "INFO" | "DETAIL" (any case); an rg::Error naming the choices otherwise.
DebugLevel parse_debug_level(std::string_view name);
const char* debug_level_name(DebugLevel level);
// The process's level: set_debug_level's, else RG_DISTRIBUTED_DEBUG's (read once), else off.
DebugLevel debug_level();
void set_debug_level(DebugLevel level);

}  // namespace rg::dist
