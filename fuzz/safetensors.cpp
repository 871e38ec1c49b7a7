// Fuzz harness: a safetensors file (8-byte header length, JSON header, data) through
// read_safetensors, the reader of every checkpoint, snapshot and weights file.
#include <sstream>

#include "engine/serialization.h"
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rg::fuzz::expect_clean(size, [&] {
    std::istringstream in(std::string(rg::fuzz::as_text(data, size)));
    const rg::SafetensorsFile f = rg::read_safetensors(in, "fuzz.safetensors");
    uint64_t bytes = 0;
    for (const auto& [name, t] : f.tensors) bytes += t.nbytes();
    rg::fuzz::require(bytes + 8 <= size, "the tensors hold more bytes than the file");
  });
  return 0;
}
