// The text of an NCCL error in rg::Error messages, the same in the real and the emulated builds:
// ncclGetErrorString's words followed by ncclGetLastError's explanation.
#pragma once

#include <string>
#include <string_view>

namespace rg::kernels {

// "invalid usage: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 1000". NCCL's
// "(run with NCCL_DEBUG=WARN for details)" is dropped when the details are there; without them
// (an empty last error) the string is kept as NCCL wrote it.
inline std::string nccl_error_text(const char* error_string, const char* last_error) {
  std::string s = error_string != nullptr ? error_string : "unknown NCCL error";
  const std::string_view last = last_error != nullptr ? last_error : "";
  if (last.empty()) return s;
  if (const size_t hint = s.find(" (run with NCCL_DEBUG="); hint != std::string::npos)
    s.erase(hint);
  s += ": ";
  s += last;
  // NCCL's warnings end with a newline.
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace rg::kernels
