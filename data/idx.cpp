// IDX parsing over a fully read (and maybe gunzipped) buffer: big-endian header, u8 payload.
#include "data/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "kernels/error.h"

namespace rg::data {
namespace {

uint32_t be32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

}  // namespace

std::vector<uint8_t> read_file_maybe_gz(const std::string& path, size_t max_bytes) {
  std::error_code ec;
  RG_CHECK(std::filesystem::is_regular_file(path, ec), path,
           ": file not found (run scripts/get-data.sh to download the dataset)");
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  RG_CHECK(f != nullptr, path, ": cannot open: ", std::strerror(errno));
  uint8_t magic[2] = {0, 0};
  const size_t got = std::fread(magic, 1, 2, f.get());
  f.reset();
  std::vector<uint8_t> out;
  if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    std::unique_ptr<gzFile_s, int (*)(gzFile)> gz(gzopen(path.c_str(), "rb"), &gzclose);
    RG_CHECK(gz != nullptr, path, ": cannot open as gzip");
    uint8_t chunk[1 << 16];
    for (;;) {
      const int n = gzread(gz.get(), chunk, sizeof(chunk));
      if (n < 0) {
        int err = 0;
        const char* msg = gzerror(gz.get(), &err);
        RG_FAIL(path, ": corrupt gzip data (", msg, ")");
      }
      if (n == 0) break;
      RG_CHECK(out.size() + size_t(n) <= max_bytes, path, ": decompresses to more than ", max_bytes,
               " bytes, which is too large for this format");
      out.insert(out.end(), chunk, chunk + n);
    }
    // gzread returns 0 at a truncated stream end too; distinguish it from a clean end.
    int err = 0;
    gzerror(gz.get(), &err);
    RG_CHECK(err == Z_OK || err == Z_STREAM_END, path, ": truncated or corrupt gzip stream");
    return out;
  }
  const auto size = std::filesystem::file_size(path, ec);
  RG_CHECK(!ec, path, ": cannot stat: ", ec.message());
  RG_CHECK(size <= max_bytes, path, ": ", size, " bytes is too large for this format");
  out.resize(size);
  f.reset(std::fopen(path.c_str(), "rb"));
  RG_CHECK(f != nullptr, path, ": cannot open: ", std::strerror(errno));
  RG_CHECK(std::fread(out.data(), 1, size, f.get()) == size, path, ": read error");
  return out;
}

IdxArray read_idx_u8(const std::string& path, int expected_rank) {
  constexpr size_t kMaxBytes = size_t(1) << 31;
  const std::vector<uint8_t> bytes = read_file_maybe_gz(path, kMaxBytes);
  RG_CHECK(bytes.size() >= 4, path, ": truncated IDX file (", bytes.size(), " bytes, no header)");
  const uint32_t magic = be32(bytes.data());
  RG_CHECK((magic >> 16) == 0, path, ": not an IDX file (magic 0x", std::hex, magic,
           ", expected 0x0000080", expected_rank, ")");
  const uint32_t type = (magic >> 8) & 0xff;
  const int rank = int(magic & 0xff);
  RG_CHECK(type == 0x08, path, ": IDX element type 0x", std::hex, type,
           " is not unsigned byte (0x08)");
  RG_CHECK(rank == expected_rank, path, ": IDX file has ", rank, " dimensions, expected ",
           expected_rank);
  const size_t header = 4 + 4 * size_t(rank);
  RG_CHECK(bytes.size() >= header, path, ": truncated IDX header");
  IdxArray out;
  uint64_t count = 1;
  for (int d = 0; d < rank; ++d) {
    const uint32_t n = be32(bytes.data() + 4 + 4 * d);
    out.dims.push_back(int64_t(n));
    count *= n;
    RG_CHECK(count <= kMaxBytes, path, ": IDX dimensions are absurdly large");
  }
  RG_CHECK(bytes.size() - header >= count, path, ": truncated IDX file: header promises ", count,
           " values but only ", bytes.size() - header, " follow");
  RG_CHECK(bytes.size() - header == count, path, ": ", bytes.size() - header - count,
           " unexpected trailing bytes after the IDX data");
  out.values.assign(bytes.begin() + std::ptrdiff_t(header), bytes.end());
  return out;
}

}  // namespace rg::data
