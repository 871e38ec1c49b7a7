// Fuzz harness: the bytes one client sends to the TCP store's server (handshake with the token
// "fuzz-token", then requests) through its decoding and handling (store_wire::serve); the server
// must answer with well-formed frames.
#include "comm/tcp_store.h"
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rg::fuzz::expect_clean(size, [&] {
    const rg::dist::Bytes sent = rg::dist::store_wire::serve(std::span(data, size), "fuzz-token");
    // Every reply is a whole frame of a size the client accepts.
    size_t pos = 0;
    while (pos < sent.size()) {
      rg::fuzz::require(sent.size() - pos >= 4, "a reply ends inside its size");
      const uint32_t n = uint32_t(sent[pos]) | uint32_t(sent[pos + 1]) << 8 |
                         uint32_t(sent[pos + 2]) << 16 | uint32_t(sent[pos + 3]) << 24;
      rg::fuzz::require(n > 0 && sent.size() - pos - 4 >= n, "a reply frame is cut short");
      pos += 4 + n;
    }
  });
  return 0;
}
