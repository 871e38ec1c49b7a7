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

bool is_gzip(std::span<const uint8_t> bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

// Ends inflate's use of the stream on every way out.
struct Inflater {
  z_stream z{};
  Inflater() = default;
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
  ~Inflater() { inflateEnd(&z); }
};

}  // namespace

std::vector<uint8_t> maybe_gunzip(std::span<const uint8_t> bytes, const std::string& name,
                                  size_t max_bytes) {
  if (!is_gzip(bytes)) return {bytes.begin(), bytes.end()};
  Inflater inf;
  RG_CHECK(inflateInit2(&inf.z, 16 + MAX_WBITS) == Z_OK, name, ": cannot open as gzip");
  std::vector<uint8_t> out;
  uint8_t chunk[1 << 16];
  size_t pos = 0;
  // One gzip member after another (as gzread reads them) until the input ends.
  while (pos < bytes.size()) {
    inf.z.next_in = const_cast<Bytef*>(bytes.data() + pos);
    const size_t avail = std::min<size_t>(bytes.size() - pos, UINT32_MAX);
    inf.z.avail_in = uInt(avail);
    int rc = Z_OK;
    do {
      inf.z.next_out = chunk;
      inf.z.avail_out = sizeof(chunk);
      rc = inflate(&inf.z, Z_NO_FLUSH);
      if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
        RG_FAIL(name, ": corrupt gzip data (", inf.z.msg != nullptr ? inf.z.msg : zError(rc), ")");
      }
      const size_t n = sizeof(chunk) - inf.z.avail_out;
      RG_CHECK(out.size() + n <= max_bytes, name, ": decompresses to more than ", max_bytes,
               " bytes, which is too large for this format");
      out.insert(out.end(), chunk, chunk + n);
      // Z_BUF_ERROR with output space left: the input ended inside the member.
      RG_CHECK(rc != Z_BUF_ERROR || inf.z.avail_out == 0, name,
               ": truncated or corrupt gzip stream");
    } while (rc != Z_STREAM_END && (inf.z.avail_in > 0 || inf.z.avail_out == 0));
    const size_t used = avail - inf.z.avail_in;
    pos += used;
    if (rc != Z_STREAM_END) {
      RG_CHECK(pos < bytes.size() && used > 0, name, ": truncated or corrupt gzip stream");
      continue;  // more than 4 GiB of input: feed the rest
    }
    // A member ended: another may follow (anything else after it is not gzip).
    if (pos < bytes.size() && !is_gzip(bytes.subspan(pos))) break;
    RG_CHECK(inflateReset(&inf.z) == Z_OK, name, ": corrupt gzip data");
  }
  return out;
}

namespace {

// The file's bytes as they are on disk (at most max_bytes).
std::vector<uint8_t> read_raw(const std::string& path, size_t max_bytes) {
  std::error_code ec;
  RG_CHECK(std::filesystem::is_regular_file(path, ec), path,
           ": file not found (run scripts/get-data.sh to download the dataset)");
  const auto size = std::filesystem::file_size(path, ec);
  RG_CHECK(!ec, path, ": cannot stat: ", ec.message());
  RG_CHECK(size <= max_bytes, path, ": ", size, " bytes is too large for this format");
  std::vector<uint8_t> raw(size);
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  RG_CHECK(f != nullptr, path, ": cannot open: ", std::strerror(errno));
  RG_CHECK(std::fread(raw.data(), 1, size, f.get()) == size, path, ": read error");
  return raw;
}

}  // namespace

std::vector<uint8_t> read_file_maybe_gz(const std::string& path, size_t max_bytes) {
  std::vector<uint8_t> raw = read_raw(path, max_bytes);
  if (!is_gzip(raw)) return raw;
  return maybe_gunzip(raw, path, max_bytes);
}

IdxArray parse_idx_u8(std::span<const uint8_t> file_bytes, const std::string& path,
                      int expected_rank, size_t max_bytes) {
  std::vector<uint8_t> gunzipped;
  std::span<const uint8_t> bytes = file_bytes;
  if (is_gzip(file_bytes)) {
    gunzipped = maybe_gunzip(file_bytes, path, max_bytes);
    bytes = gunzipped;
  }
  RG_CHECK(bytes.size() <= max_bytes, path, ": ", bytes.size(),
           " bytes is too large for this format");
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
    RG_CHECK(count <= max_bytes, path, ": IDX dimensions are absurdly large");
  }
  RG_CHECK(bytes.size() - header >= count, path, ": truncated IDX file: header promises ", count,
           " values but only ", bytes.size() - header, " follow");
  RG_CHECK(bytes.size() - header == count, path, ": ", bytes.size() - header - count,
           " unexpected trailing bytes after the IDX data");
  out.values.assign(bytes.begin() + std::ptrdiff_t(header), bytes.end());
  return out;
}

IdxArray read_idx_u8(const std::string& path, int expected_rank) {
  return parse_idx_u8(read_raw(path, kMaxIdxBytes), path, expected_rank, kMaxIdxBytes);
}

}  // namespace rg::data
