// Fuzz harness: an IDX file (MNIST images or labels, plain or gzip) through parse_idx_u8, with a
// decompression cap of 64 times the input's size.
#include "data/idx.h"

#include <span>

#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  for (const int rank : {1, 3}) {
    rg::fuzz::expect_clean(size, [&] {
      const rg::data::IdxArray a = rg::data::parse_idx_u8(bytes, "fuzz.idx", rank, 64 * size);
      uint64_t count = 1;
      for (const int64_t d : a.dims) count *= uint64_t(d);
      rg::fuzz::require(a.values.size() == count, "the values disagree with the dimensions");
    });
  }
  return 0;
}
