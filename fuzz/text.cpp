// Fuzz harness: a UTF-8 text through the character dataset's decoding and vocabulary
// (data/text.h): decode_utf8, CharVocab::from_text, encode and decode back, and the input as a
// serialised vocabulary (CharVocab::from_utf8, what a checkpoint's run.text.vocab holds).
#include "data/text.h"

#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = rg::fuzz::as_text(data, size);
  rg::fuzz::expect_clean(size, [&] {
    const std::u32string code_points = rg::data::decode_utf8(text);
    rg::fuzz::require(rg::data::encode_utf8(code_points) == text, "UTF-8 does not round-trip");
    const rg::data::CharVocab vocab = rg::data::CharVocab::from_text(text);
    const std::vector<int64_t> ids = vocab.encode(text);
    rg::fuzz::require(ids.size() == code_points.size(), "one id per character");
    rg::fuzz::require(vocab.decode(ids) == text, "ids do not decode to the text");
    const rg::data::CharVocab again = rg::data::CharVocab::from_utf8(vocab.to_utf8());
    rg::fuzz::require(again.size() == vocab.size(), "the vocabulary does not round-trip");
  });
  rg::fuzz::expect_clean(size, [&] { rg::data::CharVocab::from_utf8(text); });
  return 0;
}
