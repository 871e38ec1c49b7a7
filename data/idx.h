// Reader for the IDX format of MNIST and Fashion-MNIST (plain or gzip-compressed), with one
// clear error per kind of bad input, naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rg::data {

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28} or {60000}
  std::vector<uint8_t> values;
};

// Reads an unsigned-byte IDX file with `expected_rank` dimensions (3 for images, 1 for labels).
// Gzip is detected from the content, not the name. Errors: missing file, wrong magic, wrong
// type or rank, truncated data, trailing bytes, absurd sizes.
IdxArray read_idx_u8(const std::string& path, int expected_rank);

// The whole file, decompressed when it is gzip (limit: max_bytes, to refuse bombs).
std::vector<uint8_t> read_file_maybe_gz(const std::string& path, size_t max_bytes);

}  // namespace rg::data
