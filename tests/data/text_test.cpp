// Character-level text data: UTF-8 decoding, CharVocab (minGPT's sorted character set),
// CharDataset's train/validation samples and errors, and make_dataset("text") under a DataLoader.
#include "data/text.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "data/dataloader.h"
#include "data/registry.h"
#include "data/sampler.h"
#include "support/errors.h"
#include "support/scratch_dir.h"

namespace rg::data {
namespace {

using rg::testing::error_of;
using rg::testing::expect_error;

std::vector<int64_t> slice(const std::vector<int64_t>& v, int64_t begin, int64_t n) {
  return {v.begin() + begin, v.begin() + begin + n};
}

TEST(CharVocab, IsTheSortedSetOfCodePointsOfMultibyteText) {
  const CharVocab vocab = CharVocab::from_text("héllo wörld ✓");
  EXPECT_EQ(vocab.size(), 10);
  EXPECT_EQ(vocab.to_utf8(), " dhlorwéö✓");  // é U+E9 < ö U+F6 < ✓ U+2713
  EXPECT_EQ(vocab.encode("hé✓ "), (std::vector<int64_t>{2, 7, 9, 0}));
}

TEST(CharVocab, EncodeDecodeRoundTrip) {
  const std::string text = "héllo wörld ✓";
  const CharVocab vocab = CharVocab::from_text(text);
  const std::vector<int64_t> ids = vocab.encode(text);
  EXPECT_EQ(ids.size(), 13u);  // characters, not bytes
  EXPECT_EQ(vocab.decode(ids), text);
  expect_error([&] { vocab.decode(std::vector<int64_t>{0, 10}); }, "id 10 at position 1");
  expect_error([&] { vocab.decode(std::vector<int64_t>{-1}); }, "id -1");
}

TEST(CharVocab, SerialisedFormRoundTrip) {
  const CharVocab vocab = CharVocab::from_text("héllo wörld ✓");
  const CharVocab back = CharVocab::from_utf8(vocab.to_utf8());
  EXPECT_EQ(back.size(), vocab.size());
  EXPECT_EQ(back.to_utf8(), vocab.to_utf8());
  EXPECT_EQ(back.encode("wörld✓"), vocab.encode("wörld✓"));
  // The serialised order is the id order, even when not sorted.
  EXPECT_EQ(CharVocab::from_utf8("✓ba").encode("ab✓"), (std::vector<int64_t>{2, 1, 0}));
  expect_error([] { CharVocab::from_utf8("abca"); }, "'a' (U+0061) appears twice");
}

TEST(CharVocab, UnknownCharacterNamesItAndItsByteOffset) {
  const CharVocab vocab = CharVocab::from_text("héllo");
  expect_error([&] { vocab.encode("hé!"); }, "'!' (U+0021) at byte offset 3");
  expect_error([&] { vocab.encode("h\n"); }, "U+000A at byte offset 1");
}

TEST(Utf8, InvalidInputIsAnErrorWithItsByteOffset) {
  expect_error([] { CharVocab::from_text("ab\xC3("); }, "byte offset 2");
  expect_error([] { CharVocab::from_text("ab\xC3("); }, "not a continuation byte");
  expect_error([] { CharVocab::from_text("a\xFF"); }, "byte offset 1: byte 0xFF");
  expect_error([] { CharVocab::from_text("\x80"); }, "continuation byte without a lead byte");
  expect_error([] { CharVocab::from_text("ab\xE2\x9C"); }, "byte offset 2: the text ends");
  expect_error([] { CharVocab::from_text("x\xC0\x80"); }, "byte offset 1: overlong");
  expect_error([] { CharVocab::from_text("\xED\xA0\x80"); }, "surrogate U+D800");
  expect_error([] { CharVocab::from_text("\xF4\x90\x80\x80"); }, "past U+10FFFF");
  expect_error([] { CharVocab::from_utf8("a\xC3"); }, "byte offset 1");
  const CharVocab vocab = CharVocab::from_text("abc");
  expect_error([&] { vocab.encode("abc\xE2\x9C"); }, "byte offset 3");
  EXPECT_EQ(decode_utf8("\xF0\x9F\x98\x80"), std::u32string(1, U'\U0001F600'));
  EXPECT_EQ(encode_utf8(U"\U0001F600é"), "\xF0\x9F\x98\x80\xC3\xA9");
}

// 28 characters, 23 distinct: train = the first round(28 * 0.75) = 21, validation the last 7
// ("qr stzz"); 'z' is only in the validation part.
class CharDatasetTest : public rg::testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    path_ = (dir_ / "input.txt").string();
    std::ofstream(path_, std::ios::binary) << text_;
    ASSERT_EQ(decode_utf8(text_).size(), 28u);
    all_ids_ = CharVocab::from_text(text_).encode(text_);
  }
  const std::string text_ = "ab✓cdé fgh✓ijk lmnö pqr stzz";
  std::string path_;
  std::vector<int64_t> all_ids_;
};

TEST_F(CharDatasetTest, TrainSamplesAreEveryOffsetWithTargetsShiftedByOne) {
  const CharDataset ds(path_, 3, TextSplit::train, 0.25);
  EXPECT_EQ(ds.size(), 21 - 3);
  EXPECT_EQ(ds.sample_shape(), (Shape{3}));
  const std::vector<int64_t> idx = {0, 5, 17};
  const Batch b = ds.get_batch(idx, 0);
  ASSERT_EQ(b.inputs.dtype(), DType::i64);
  ASSERT_EQ(b.targets.dtype(), DType::i64);
  ASSERT_EQ(b.inputs.shape(), (Shape{3, 3}));
  ASSERT_EQ(b.targets.shape(), (Shape{3, 3}));
  const auto x = b.inputs.to_vector<int64_t>();
  const auto y = b.targets.to_vector<int64_t>();
  for (size_t r = 0; r < idx.size(); ++r) {
    EXPECT_EQ(slice(x, int64_t(r) * 3, 3), slice(all_ids_, idx[r], 3)) << "sample " << idx[r];
    EXPECT_EQ(slice(y, int64_t(r) * 3, 3), slice(all_ids_, idx[r] + 1, 3)) << "sample " << idx[r];
  }
  // Sample 1 is "b✓c" -> "✓cd", by hand.
  EXPECT_EQ(ds.vocab().decode(ds.get_batch(std::vector<int64_t>{1}, 0).inputs.to_vector<int64_t>()),
            "b✓c");
  EXPECT_EQ(
      ds.vocab().decode(ds.get_batch(std::vector<int64_t>{1}, 0).targets.to_vector<int64_t>()),
      "✓cd");
  expect_error([&] { ds.get_batch(std::vector<int64_t>{18}, 0); }, "index 18 out of range");
}

TEST_F(CharDatasetTest, ValidationBlocksDoNotOverlapAndCoverTheSplit) {
  const CharDataset ds(path_, 3, TextSplit::validation, 0.25);
  ASSERT_EQ(ds.size(), 2);  // (7 - 1) / 3: offsets 0 and 3 of the last 7 characters
  const Batch b = ds.get_batch(std::vector<int64_t>{0, 1}, 0);
  const auto x = b.inputs.to_vector<int64_t>();
  const auto y = b.targets.to_vector<int64_t>();
  EXPECT_EQ(slice(x, 0, 3), slice(all_ids_, 21, 3));
  EXPECT_EQ(slice(y, 0, 3), slice(all_ids_, 22, 3));
  EXPECT_EQ(slice(x, 3, 3), slice(all_ids_, 24, 3));
  EXPECT_EQ(slice(y, 3, 3), slice(all_ids_, 25, 3));
  EXPECT_EQ(ds.vocab().decode(x), "qr stz");
  EXPECT_EQ(ds.vocab().decode(y), "r stzz");  // each target character predicted once
  expect_error([&] { ds.get_batch(std::vector<int64_t>{2}, 0); }, "index 2 out of range");
  // With the default fraction: round(28 * 0.9) = 25 train, 3 validation characters.
  EXPECT_EQ(CharDataset(path_, 2, TextSplit::validation).size(), 1);
  EXPECT_EQ(CharDataset(path_, 2, TextSplit::train).size(), 23);
}

TEST_F(CharDatasetTest, BothSplitsShareTheWholeFilesVocabulary) {
  const CharDataset train(path_, 3, TextSplit::train, 0.25);
  const CharDataset val(path_, 3, TextSplit::validation, 0.25);
  EXPECT_EQ(train.vocab().to_utf8(), val.vocab().to_utf8());
  EXPECT_EQ(train.vocab().to_utf8(), CharVocab::from_text(text_).to_utf8());
  EXPECT_GE(train.vocab().id_of(U'z'), 0);  // only in the validation characters
  EXPECT_EQ(train.num_classes(), 23);
  EXPECT_EQ(val.num_classes(), 23);
}

TEST_F(CharDatasetTest, TooShortSplitsAndBadFilesAreErrors) {
  const std::string val_msg = error_of([&] { CharDataset(path_, 7, TextSplit::validation, 0.25); });
  EXPECT_NE(val_msg.find(path_), std::string::npos) << val_msg;
  EXPECT_NE(val_msg.find("validation split has 7 characters"), std::string::npos) << val_msg;
  EXPECT_NE(val_msg.find("block_size 7"), std::string::npos) << val_msg;
  EXPECT_EQ(CharDataset(path_, 6, TextSplit::validation, 0.25).size(), 1);  // 7 is just enough
  expect_error([&] { CharDataset(path_, 21, TextSplit::train, 0.25); },
               "train split has 21 characters, too few for one sample of block_size 21");
  expect_error([&] { CharDataset(path_, 2, TextSplit::validation, 0.0); },
               "validation split has 0 characters");
  const std::string missing = (dir_ / "missing.txt").string();
  expect_error([&] { CharDataset(missing, 2, TextSplit::train); }, missing + ": cannot open");
  const std::string bad = (dir_ / "bad.txt").string();
  std::ofstream(bad, std::ios::binary) << "abcdef\xC3";
  expect_error([&] { CharDataset(bad, 2, TextSplit::train); },
               bad + ": invalid UTF-8 at byte offset 6");
  expect_error([&] { CharDataset(path_, 0, TextSplit::train); }, "block_size must be positive");
  expect_error([&] { CharDataset(path_, 2, TextSplit::train, 1.5); }, "val_fraction");
}

TEST_F(CharDatasetTest, DataLoaderOverMakeDatasetYieldsI64Blocks) {
  DatasetOptions options;
  expect_error([&] { make_dataset("text", "", true, options); },
               "--dataset text needs --data-file FILE");
  options.data_file = path_;
  options.block_size = 4;
  options.val_fraction = 0.25;
  auto train = make_dataset("text", "ignored/dir", true, options);
  auto val = make_dataset("text", "ignored/dir", false, options);
  EXPECT_EQ(train->size(), 21 - 4);
  EXPECT_EQ(val->size(), 1);  // (7 - 1) / 4
  EXPECT_EQ(train->sample_shape(), (Shape{4}));
  DataLoader loader(train, std::make_shared<SequentialSampler>(train->size()),
                    DataLoaderOptions{.batch_size = 5, .workers = 2, .prefetch = 2});
  loader.start_epoch(0);
  int64_t batches = 0, row = 0;
  while (auto b = loader.next()) {
    ASSERT_EQ(b->inputs.dtype(), DType::i64);
    ASSERT_EQ(b->targets.dtype(), DType::i64);
    const int64_t rows = b->inputs.size(0);
    ASSERT_EQ(b->inputs.shape(), (Shape{rows, 4}));
    ASSERT_EQ(b->targets.shape(), (Shape{rows, 4}));
    const auto x = b->inputs.to_vector<int64_t>();
    const auto y = b->targets.to_vector<int64_t>();
    for (int64_t r = 0; r < rows; ++r, ++row) {
      EXPECT_EQ(slice(x, r * 4, 4), slice(all_ids_, row, 4)) << "sample " << row;
      EXPECT_EQ(slice(y, r * 4, 4), slice(all_ids_, row + 1, 4)) << "sample " << row;
    }
    ++batches;
  }
  EXPECT_EQ(batches, 4);  // 17 samples in batches of 5
  EXPECT_EQ(row, 17);
}

}  // namespace
}  // namespace rg::data
