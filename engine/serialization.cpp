// safetensors writing (atomic: temp file, fsync, rename) and reading with full validation.
#include "engine/serialization.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "kernels/error.h"

namespace rg {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; this host is big-endian");

constexpr const char* kCrcKey = "rg.crc32";
constexpr uint64_t kMaxHeader = uint64_t{100} << 20;  // as the reference implementation

const char* format_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::f16:
      return "F16";
    case DType::bf16:
      return "BF16";
    case DType::i64:
      return "I64";
    case DType::i32:
      return "I32";
    case DType::u8:
      return "U8";
  }
  RG_ASSERT(false, "dtype enum value ", static_cast<int>(t), " is not a DType");
  __builtin_unreachable();
}

bool parse_dtype(const std::string& s, DType& out) {
  for (DType t :
       {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8}) {
    if (s == format_dtype(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

std::string crc_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

uint32_t crc_update(uint32_t crc, const void* data, size_t n) {
  // zlib's crc32 takes uInt lengths: feed large buffers in chunks.
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, chunk));
    p += chunk;
    n -= chunk;
  }
  return crc;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    RG_CHECK(w > 0, path, ": write failed: ", std::strerror(errno));
    p += w;
    n -= size_t(w);
  }
}

std::mutex partial_write_mutex;
std::function<void()> partial_write_hook;

std::function<void()> take_partial_write_hook() {
  std::lock_guard<std::mutex> lock(partial_write_mutex);
  return std::exchange(partial_write_hook, {});
}

// `<file>.tmp.` followed by mkstemp's six characters.
bool is_save_temporary_of(const std::string& name, const std::string& file) {
  const std::string prefix = file + ".tmp.";
  return name.size() == prefix.size() + 6 && name.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

void set_partial_write_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(partial_write_mutex);
  partial_write_hook = std::move(hook);
}

int remove_save_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string file = target.filename().string();
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (is_save_temporary_of(entry.path().filename().string(), file) &&
        fs::remove(entry.path(), ec))
      ++removed;
  }
  return removed;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  namespace fs = std::filesystem;
  std::vector<Tensor> host;
  host.reserve(tensors.size());
  std::set<std::string> names;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  uint32_t crc = static_cast<uint32_t>(crc32(0, nullptr, 0));
  for (const auto& [name, t] : tensors) {
    RG_CHECK(!name.empty() && name != "__metadata__", "save_safetensors(", path,
             "): invalid tensor name '", name, "'");
    RG_CHECK(names.insert(name).second, "save_safetensors(", path, "): the name '", name,
             "' appears twice");
    RG_CHECK(t.defined(), "save_safetensors(", path, "): tensor '", name, "' is undefined");
    // safetensors is row-major: a channels_last tensor is written in its shape's order.
    host.push_back((t.device().is_cpu() ? t.detach() : t.detach().to(Device::cpu())).contiguous());
    const Tensor& h = host.back();
    header[name] = {{"dtype", format_dtype(h.dtype())},
                    {"shape", h.shape()},
                    {"data_offsets", {offset, offset + h.nbytes()}}};
    offset += h.nbytes();
    crc = crc_update(crc, h.raw_data(), h.nbytes());
  }
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [k, v] : metadata) {
    RG_CHECK(k != kCrcKey, "save_safetensors(", path, "): metadata key '", k, "' is reserved");
    meta[k] = v;
  }
  meta[kCrcKey] = crc_hex(crc);
  header["__metadata__"] = meta;
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t header_size = json.size();

  // Write next to the destination, flush to disk, then rename over it.
  const fs::path target(path);
  // A unique name (mkstemp), so concurrent saves to one path never share a temporary file.
  std::string tmp_name =
      (target.parent_path() / (target.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = ::mkstemp(tmp_name.data());
  RG_CHECK(fd >= 0, path, ": cannot create ", tmp_name, ": ", std::strerror(errno));
  ::fchmod(fd, 0644);  // mkstemp creates 0600; a checkpoint is an ordinary file
  const fs::path tmp(tmp_name);
  std::function<void()> partial_write = take_partial_write_hook();
  try {
    write_all(fd, &header_size, 8, path);
    write_all(fd, json.data(), json.size(), path);
    uint64_t written = 0;
    for (const Tensor& h : host) {
      if (partial_write && written * 2 >= offset) std::exchange(partial_write, {})();
      write_all(fd, h.raw_data(), h.nbytes(), path);
      written += h.nbytes();
    }
    if (partial_write) partial_write();
    RG_CHECK(::fsync(fd) == 0, path, ": fsync failed: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    RG_FAIL(path, ": cannot rename ", tmp.string(), " to it: ", std::strerror(err));
  }
  // Make the rename itself durable.
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RG_CHECK(in, path, ": cannot open for reading (", std::strerror(errno), ")");
  return read_safetensors(in, path);
}

SafetensorsFile read_safetensors(std::istream& in, const std::string& path) {
  in.seekg(0, std::ios::end);
  const auto end = static_cast<std::streamoff>(in.tellg());
  RG_CHECK(in && end >= 0, path, ": cannot find the end of the file");
  const auto file_size = static_cast<uint64_t>(end);
  in.seekg(0);
  RG_CHECK(file_size >= 8, path, ": not a safetensors file (", file_size,
           " bytes, shorter than the 8-byte header length)");
  uint64_t header_size = 0;
  in.read(reinterpret_cast<char*>(&header_size), 8);
  RG_CHECK(header_size <= kMaxHeader && header_size <= file_size - 8, path,
           ": not a safetensors file (header length ", header_size, " for a file of ", file_size,
           " bytes)");
  std::string json(header_size, '\0');
  in.read(json.data(), std::streamsize(header_size));
  RG_CHECK(in, path, ": read error in the header");
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    RG_FAIL(path, ": the safetensors header is not valid JSON (", e.what(), ")");
  }
  RG_CHECK(header.is_object(), path, ": the safetensors header is not a JSON object");
  const uint64_t data_size = file_size - 8 - header_size;

  SafetensorsFile out;
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      RG_CHECK(v.is_object(), path, ": __metadata__ is not a JSON object");
      for (const auto& [k, mv] : v.items()) {
        RG_CHECK(mv.is_string(), path, ": metadata value of '", k, "' is not a string");
        out.metadata[k] = mv.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    RG_CHECK(
        v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
        where, ": needs dtype, shape and data_offsets");
    Entry e{name, DType::f32, {}, 0, 0};
    RG_CHECK(v["dtype"].is_string() && parse_dtype(v["dtype"].get<std::string>(), e.dtype), where,
             ": unsupported dtype ", v["dtype"].dump(),
             " (ringgrad reads F32, F64, F16, BF16, I64, "
             "I32, U8)");
    RG_CHECK(v["shape"].is_array(), where, ": shape is not an array");
    uint64_t bytes = element_size(e.dtype);
    for (const auto& d : v["shape"]) {
      RG_CHECK(d.is_number_unsigned(), where, ": shape ", v["shape"].dump(),
               " has a non-integer or negative size");
      const auto n = d.get<uint64_t>();
      // Bounded by the file: a shape whose bytes overflow cannot match its data_offsets.
      RG_CHECK(n <= uint64_t(INT64_MAX) && !__builtin_mul_overflow(bytes, n, &bytes), where,
               ": shape ", v["shape"].dump(), " is too large");
      e.shape.push_back(int64_t(n));
    }
    const auto& off = v["data_offsets"];
    RG_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                 off[1].is_number_unsigned(),
             where, ": data_offsets must be [begin, end]");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    RG_CHECK(e.begin <= e.end && e.end <= data_size, where, ": data_offsets [", e.begin, ", ",
             e.end, "] outside the ", data_size, " data bytes (truncated file?)");
    RG_CHECK(e.end - e.begin == bytes, where, ": ", e.end - e.begin, " bytes for shape ",
             v["shape"].dump(), " of ", v["dtype"].get<std::string>());
    entries.push_back(std::move(e));
  }
  // The data must be covered exactly: sorted by offset, each tensor starts where the last ended.
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  uint64_t expected = 0;
  for (const Entry& e : entries) {
    RG_CHECK(e.begin == expected, path, ": tensor '", e.name, "' starts at byte ", e.begin,
             " of the data, expected ", expected, " (overlapping tensors or a hole)");
    expected = e.end;
  }
  RG_CHECK(expected == data_size, path, ": the tensors cover ", expected, " of the ", data_size,
           " data bytes");
  uint32_t crc = static_cast<uint32_t>(crc32(0, nullptr, 0));
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    in.read(static_cast<char*>(t.raw_data()), std::streamsize(t.nbytes()));
    RG_CHECK(in, path, ": read error in tensor '", e.name, "'");
    crc = crc_update(crc, t.raw_data(), t.nbytes());
    out.tensors.emplace_back(e.name, std::move(t));
  }
  if (const auto it = out.metadata.find(kCrcKey); it != out.metadata.end()) {
    RG_CHECK(it->second == crc_hex(crc), path, ": the data's CRC-32 is ", crc_hex(crc),
             " but the file records ", it->second, " (the file is corrupt)");
  }
  return out;
}

}  // namespace rg
