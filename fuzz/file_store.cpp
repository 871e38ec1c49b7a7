// Fuzz harness: a FileStore's record log (file:// rendezvous) through FileStore::replay, then the
// integer reading that add() and the last-one-out count apply to the values.
#include "comm/file_store.h"

#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, rg::dist::Bytes> store;
  rg::fuzz::expect_clean(size, [&] {
    rg::dist::FileStore::replay(rg::fuzz::as_text(data, size), "fuzz.store", store);
  });
  for (const auto& [key, value] : store) rg::dist::parse_store_int(value);
  return 0;
}
