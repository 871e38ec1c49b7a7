// Fuzz harness: a reply frame as the TCP store's client reads it (store_wire::decode_reply); the
// first byte picks the request it answers (0: the handshake, 1 set .. 8 num_keys).
#include "comm/tcp_store.h"
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  rg::fuzz::expect_clean(size, [&] {
    rg::dist::store_wire::decode_reply(data[0] % 9, std::span(data + 1, size - 1));
  });
  return 0;
}
