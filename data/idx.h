// Reader for the IDX format of MNIST and Fashion-MNIST (plain or gzip-compressed), with one
// clear error per kind of bad input, naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
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

// The largest IDX file read_idx_u8 accepts (decompressed): 2 GiB.
inline constexpr size_t kMaxIdxBytes = size_t(1) << 31;

// The same on a file's bytes as read (`name` names it in messages): gunzipped when they are gzip
// (at most max_bytes of output), then parsed. read_idx_u8 is this after reading the file; the
// fuzzer calls it with max_bytes = 64 x the input's size.
IdxArray parse_idx_u8(std::span<const uint8_t> file_bytes, const std::string& name,
                      int expected_rank, size_t max_bytes = kMaxIdxBytes);

// `bytes` decompressed when they start with the gzip magic (every member of a multi-member
// stream; limit: max_bytes of output, to refuse bombs), else as they are.
std::vector<uint8_t> maybe_gunzip(std::span<const uint8_t> bytes, const std::string& name,
                                  size_t max_bytes);

// The whole file, decompressed when it is gzip (limit: max_bytes, to refuse bombs).
std::vector<uint8_t> read_file_maybe_gz(const std::string& path, size_t max_bytes);

}  // namespace rg::data
