// Character-level text data as in minGPT's CharDataset: a vocabulary of the Unicode code points
// of a UTF-8 text, and a dataset of (block, block shifted by one) pairs of token ids from a file.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/dataset.h"

namespace rg::data {

// The code points of `utf8` (strict UTF-8: no overlong forms, surrogates or values past
// U+10FFFF); invalid UTF-8 is an rg::Error naming the byte offset.
std::u32string decode_utf8(std::string_view utf8);
// The UTF-8 bytes of `code_points` (each must be a valid scalar value).
std::string encode_utf8(std::u32string_view code_points);

// Token id i is the i-th character of the vocabulary.
class CharVocab {
 public:
  CharVocab() = default;  // empty
  // The sorted set of code points of `utf8`, as minGPT's sorted(list(set(data))).
  static CharVocab from_text(std::string_view utf8);
  static CharVocab from_code_points(std::u32string_view code_points);  // likewise
  // The vocabulary that to_utf8() wrote: its characters concatenated in id order (distinct).
  static CharVocab from_utf8(std::string_view chars);
  std::string to_utf8() const;

  int64_t size() const { return int64_t(chars_.size()); }
  // A character not in the vocabulary is an rg::Error naming it and its byte offset.
  std::vector<int64_t> encode(std::string_view utf8) const;
  // An id outside [0, size()) is an rg::Error.
  std::string decode(std::span<const int64_t> ids) const;
  // The id of code point `c`, or -1 when it is not in the vocabulary.
  int64_t id_of(char32_t c) const;

 private:
  explicit CharVocab(std::u32string chars);
  std::u32string chars_;
  std::unordered_map<char32_t, int64_t> ids_;
};

enum class TextSplit { train, validation };

// A UTF-8 text file as token ids; the vocabulary is that of the whole file, so both splits share
// it. The train split is the first round(n * (1 - val_fraction)) characters, validation the rest.
// Train sample i (every offset, as minGPT): inputs ids[i, i+T), targets ids[i+1, i+T+1).
// Validation sample k: the same at offset k*T, so the blocks do not overlap and one pass over the
// validation set sees each of its characters once. Inputs and targets are i64 [B, T].
class CharDataset final : public Dataset {
 public:
  CharDataset(const std::string& path, int64_t block_size, TextSplit split,
              double val_fraction = 0.1);

  int64_t size() const override { return size_; }
  Batch get_batch(std::span<const int64_t> indices, int64_t epoch) const override;
  Shape sample_shape() const override { return {block_size_}; }
  int64_t num_classes() const override { return vocab_.size(); }
  const CharVocab& vocab() const { return vocab_; }
  int64_t block_size() const { return block_size_; }

 private:
  CharVocab vocab_;
  std::vector<int64_t> ids_;  // this split's characters
  int64_t block_size_;
  TextSplit split_;
  int64_t size_ = 0;
};

}  // namespace rg::data
