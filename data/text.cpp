// UTF-8 decoding/encoding, the character vocabulary and the character-level text dataset.
#include "data/text.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "kernels/error.h"

namespace rg::data {
namespace {

std::string hex_byte(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", unsigned(b));
  return buf;
}

std::string u_plus(char32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", unsigned(c));
  return buf;
}

// "'x' (U+0078)", or just "U+000A" for a control character, which would break the line.
std::string describe(char32_t c) {
  if (c < 0x20 || c == 0x7F) return u_plus(c);
  return detail::cat('\'', encode_utf8(std::u32string_view(&c, 1)), "' (", u_plus(c), ')');
}

// The code point starting at s[pos]; advances pos past it. Strict: no overlong forms, surrogates
// or values past U+10FFFF.
char32_t next_code_point(std::string_view s, size_t& pos) {
  const size_t start = pos;
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  int len;
  char32_t c;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, c = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, c = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, c = b0 & 0x07;
  } else {
    RG_FAIL("invalid UTF-8 at byte offset ", start, ": byte ", hex_byte(b0),
            ((b0 & 0xC0) == 0x80 ? " is a continuation byte without a lead byte"
                                 : " cannot start a character"));
  }
  RG_CHECK(start + size_t(len) <= s.size(), "invalid UTF-8 at byte offset ", start,
           ": the text ends inside a ", len, "-byte character");
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[start + size_t(k)]);
    RG_CHECK((b & 0xC0) == 0x80, "invalid UTF-8 at byte offset ", start, ": byte ", hex_byte(b),
             " at offset ", start + size_t(k), " is not a continuation byte");
    c = (c << 6) | (b & 0x3F);
  }
  static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  RG_CHECK(c >= kMin[len], "invalid UTF-8 at byte offset ", start, ": overlong encoding of ",
           u_plus(c));
  RG_CHECK(c < 0xD800 || c > 0xDFFF, "invalid UTF-8 at byte offset ", start,
           ": encodes the surrogate ", u_plus(c));
  RG_CHECK(c <= 0x10FFFF, "invalid UTF-8 at byte offset ", start,
           ": encodes a value past U+10FFFF");
  pos = start + size_t(len);
  return c;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RG_CHECK(in.is_open(), path, ": cannot open (", std::strerror(errno), ")");
  std::ostringstream s;
  s << in.rdbuf();
  RG_CHECK(!in.bad(), path, ": read error");
  return std::move(s).str();
}

}  // namespace

std::u32string decode_utf8(std::string_view utf8) {
  std::u32string out;
  out.reserve(utf8.size());
  for (size_t pos = 0; pos < utf8.size();) out.push_back(next_code_point(utf8, pos));
  return out;
}

std::string encode_utf8(std::u32string_view code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (const char32_t c : code_points) {
    RG_CHECK(c <= 0x10FFFF && (c < 0xD800 || c > 0xDFFF), "encode_utf8: ", unsigned(c),
             " is not a Unicode scalar value");
    if (c < 0x80) {
      out += char(c);
    } else if (c < 0x800) {
      out += char(0xC0 | (c >> 6));
      out += char(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += char(0xE0 | (c >> 12));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    } else {
      out += char(0xF0 | (c >> 18));
      out += char(0x80 | ((c >> 12) & 0x3F));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    }
  }
  return out;
}

CharVocab::CharVocab(std::u32string chars) : chars_(std::move(chars)) {
  for (size_t i = 0; i < chars_.size(); ++i) {
    const bool inserted = ids_.emplace(chars_[i], int64_t(i)).second;
    RG_CHECK(inserted, "CharVocab: character ", describe(chars_[i]),
             " appears twice in the vocabulary");
  }
}

CharVocab CharVocab::from_code_points(std::u32string_view code_points) {
  // One pass marking the code points seen (a text has few distinct ones), then the marks in order:
  // linear in the text, where sorting it all took a noticeable part of a run's start.
  std::vector<bool> seen;
  for (const char32_t c : code_points) {
    if (size_t(c) >= seen.size()) seen.resize(std::max<size_t>(size_t(c) + 1, 2 * seen.size()));
    seen[size_t(c)] = true;
  }
  std::u32string chars;
  for (size_t c = 0; c < seen.size(); ++c)
    if (seen[c]) chars.push_back(char32_t(c));
  return CharVocab(std::move(chars));
}

CharVocab CharVocab::from_text(std::string_view utf8) {
  return from_code_points(decode_utf8(utf8));
}

CharVocab CharVocab::from_utf8(std::string_view chars) { return CharVocab(decode_utf8(chars)); }

std::string CharVocab::to_utf8() const { return encode_utf8(chars_); }

int64_t CharVocab::id_of(char32_t c) const {
  const auto it = ids_.find(c);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<int64_t> CharVocab::encode(std::string_view utf8) const {
  std::vector<int64_t> out;
  out.reserve(utf8.size());
  for (size_t pos = 0; pos < utf8.size();) {
    const size_t start = pos;
    const char32_t c = next_code_point(utf8, pos);
    const int64_t id = id_of(c);
    RG_CHECK(id >= 0, "character ", describe(c), " at byte offset ", start,
             " is not in the vocabulary (", size(), " characters)");
    out.push_back(id);
  }
  return out;
}

std::string CharVocab::decode(std::span<const int64_t> ids) const {
  std::u32string chars;
  chars.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    RG_CHECK(ids[i] >= 0 && ids[i] < size(), "CharVocab::decode: id ", ids[i], " at position ", i,
             " is outside the vocabulary [0, ", size(), ")");
    chars.push_back(chars_[size_t(ids[i])]);
  }
  return encode_utf8(chars);
}

CharDataset::CharDataset(const std::string& path, int64_t block_size, TextSplit split,
                         double val_fraction)
    : block_size_(block_size), split_(split) {
  RG_CHECK(block_size > 0, "CharDataset: block_size must be positive, got ", block_size);
  RG_CHECK(val_fraction >= 0 && val_fraction <= 1,
           "CharDataset: val_fraction must be in [0, 1], got ", val_fraction);
  const std::string bytes = read_file(path);
  std::u32string text;
  try {
    text = decode_utf8(bytes);
  } catch (const Error& e) {
    RG_FAIL(path, ": ", e.what());
  }
  vocab_ = CharVocab::from_code_points(text);
  const auto n = int64_t(text.size());
  const int64_t n_train = std::llround(double(n) * (1.0 - val_fraction));
  const bool train = split == TextSplit::train;
  const int64_t begin = train ? 0 : n_train;
  const int64_t count = train ? n_train : n - n_train;
  RG_CHECK(count >= block_size + 1, path, ": the ", train ? "train" : "validation", " split has ",
           count, " characters, too few for one sample of block_size ", block_size, " (needs ",
           block_size + 1, ")");
  ids_.resize(size_t(count));
  for (int64_t i = 0; i < count; ++i) ids_[size_t(i)] = vocab_.id_of(text[size_t(begin + i)]);
  size_ = train ? count - block_size : (count - 1) / block_size;
}

Batch CharDataset::get_batch(std::span<const int64_t> indices, int64_t /*epoch*/) const {
  const auto b = int64_t(indices.size());
  const int64_t t = block_size_;
  Batch batch{Tensor::empty({b, t}, DType::i64), Tensor::empty({b, t}, DType::i64), {}};
  int64_t* x = batch.inputs.data<int64_t>();
  int64_t* y = batch.targets.data<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t idx = indices[size_t(i)];
    RG_CHECK(idx >= 0 && idx < size_, "CharDataset: index ", idx, " out of range [0, ", size_, ")");
    const int64_t* src = ids_.data() + (split_ == TextSplit::train ? idx : idx * t);
    std::copy(src, src + t, x + i * t);
    std::copy(src + 1, src + t + 1, y + i * t);
  }
  return batch;
}

}  // namespace rg::data
