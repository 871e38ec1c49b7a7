// CIFAR-10/100 reading from files the test writes in the real binary format (records of label
// byte(s) + 3072 channel-plane pixels), the crop-and-flip augmentation, and every kind of bad
// input (missing file, truncated file, label out of range, index out of range).
#include "data/cifar.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/registry.h"
#include "kernels/error.h"
#include "support/errors.h"
#include "support/scratch_dir.h"

namespace rg::data {
namespace {

namespace fs = std::filesystem;
using rg::testing::error_of;
constexpr int64_t kPixels = CifarDataset::kPixels;

// The pixel byte of global sample `sample` at flat position p (channel plane order).
uint8_t pixel(int64_t sample, int64_t p) {
  return uint8_t((sample * 37 + p * 11 + p / 1024) % 256);
}

class CifarFiles : public rg::testing::ScratchDirTest {
 protected:
  // Writes `count` records for global samples first.. first+count-1 with the given labels.
  void write(const fs::path& path, int64_t first, int64_t count,
             const std::function<std::vector<uint8_t>(int64_t)>& labels_of) {
    fs::create_directories(path.parent_path());
    std::ofstream out(path, std::ios::binary);
    for (int64_t s = first; s < first + count; ++s) {
      std::vector<uint8_t> record = labels_of(s);
      for (int64_t p = 0; p < kPixels; ++p) record.push_back(pixel(s, p));
      out.write(reinterpret_cast<const char*>(record.data()), std::streamsize(record.size()));
    }
  }
  // CIFAR-10 train files with 3, 1, 4, 1 and 5 records (labels s % 10) and a 2-record test file.
  void write_cifar10(const fs::path& dir) {
    const auto label = [](int64_t s) { return std::vector<uint8_t>{uint8_t(s % 10)}; };
    const int64_t counts[] = {3, 1, 4, 1, 5};
    int64_t first = 0;
    for (int i = 0; i < 5; ++i) {
      write(dir / ("data_batch_" + std::to_string(i + 1) + ".bin"), first, counts[i], label);
      first += counts[i];
    }
    write(dir / "test_batch.bin", 100, 2, label);
  }
};

// The normalized value the loader must produce for byte v in channel c.
float normalized(uint8_t v, int c, CifarKind kind) {
  const Normalize n = CifarDataset::default_normalize(kind);
  return (float(v) * (1.0f / 255.0f) - n.mean[size_t(c)]) * (1.0f / n.std[size_t(c)]);
}

TEST_F(CifarFiles, Cifar10ReadsTheFiveTrainingFilesInOrderAndTheTestFile) {
  write_cifar10(dir_);
  const CifarDataset train(dir_.string(), true, CifarKind::cifar10);
  ASSERT_EQ(train.size(), 14);
  EXPECT_EQ(train.sample_shape(), (Shape{3, 32, 32}));
  EXPECT_EQ(train.num_classes(), 10);
  const std::vector<int64_t> idx = {0, 3, 13, 8};
  const Batch b = train.get_batch(idx, 0);
  ASSERT_EQ(b.inputs.shape(), (Shape{4, 3, 32, 32}));
  const auto x = b.inputs.to_vector<float>();
  const auto y = b.targets.to_vector<int64_t>();
  for (size_t i = 0; i < idx.size(); ++i) {
    EXPECT_EQ(y[i], idx[i] % 10);
    for (int64_t p : {int64_t(0), int64_t(31), int64_t(1024), int64_t(2047), int64_t(3071)}) {
      EXPECT_FLOAT_EQ(x[i * kPixels + size_t(p)],
                      normalized(pixel(idx[i], p), int(p / 1024), CifarKind::cifar10))
          << "sample " << idx[i] << " pixel " << p;
    }
  }
  const CifarDataset test(dir_.string(), false, CifarKind::cifar10);
  ASSERT_EQ(test.size(), 2);
  EXPECT_EQ(test.get_batch(std::vector<int64_t>{1}, 0).targets.item(), 101 % 10);
}

TEST_F(CifarFiles, TheArchiveFolderIsFoundInsideTheDirectory) {
  write_cifar10(dir_ / "cifar-10-batches-bin");
  EXPECT_EQ(CifarDataset(dir_.string(), true, CifarKind::cifar10).size(), 14);
}

TEST_F(CifarFiles, Cifar100UsesTheFineLabel) {
  const auto labels = [](int64_t s) {
    return std::vector<uint8_t>{uint8_t(s % 20), uint8_t(99 - s)};
  };
  write(dir_ / "cifar-100-binary" / "train.bin", 0, 6, labels);
  write(dir_ / "cifar-100-binary" / "test.bin", 0, 1, labels);
  const CifarDataset train(dir_.string(), true, CifarKind::cifar100);
  ASSERT_EQ(train.size(), 6);
  EXPECT_EQ(train.num_classes(), 100);
  const Batch b = train.get_batch(std::vector<int64_t>{0, 5}, 0);
  EXPECT_EQ(b.targets.to_vector<int64_t>(), (std::vector<int64_t>{99, 94}));
  EXPECT_FLOAT_EQ(b.inputs.to_vector<float>()[kPixels + 2048],
                  normalized(pixel(5, 2048), 2, CifarKind::cifar100));
  EXPECT_EQ(CifarDataset(dir_.string(), false, CifarKind::cifar100).size(), 1);
}

TEST_F(CifarFiles, WhicheverTrainingFilesExistAreReadAndTheMissingOnesNamed) {
  write_cifar10(dir_);
  fs::remove(dir_ / "data_batch_2.bin");  // 1 record
  fs::remove(dir_ / "data_batch_5.bin");  // 5 records
  const CifarDataset train(dir_.string(), true, CifarKind::cifar10);
  EXPECT_EQ(train.size(), 3 + 4 + 1);
  EXPECT_EQ(train.missing_files(),
            (std::vector<std::string>{"data_batch_2.bin", "data_batch_5.bin"}));
  // Sample 3 is data_batch_3's first record (global sample 4 as written).
  const Batch b = train.get_batch(std::vector<int64_t>{3}, 0);
  EXPECT_EQ(b.targets.item(), 4);
  EXPECT_FLOAT_EQ(b.inputs.to_vector<float>()[0], normalized(pixel(4, 0), 0, CifarKind::cifar10));
  EXPECT_TRUE(CifarDataset(dir_.string(), false, CifarKind::cifar10).missing_files().empty());
}

TEST_F(CifarFiles, BadFilesAreClearErrors) {
  // None of the split's files: names them, the archive folder and where to get them.
  std::string e = error_of([&] { CifarDataset(dir_.string(), true, CifarKind::cifar10); });
  EXPECT_NE(e.find("no cifar10 training file found: expected data_batch_1.bin, data_batch_2.bin, "
                   "data_batch_3.bin, data_batch_4.bin, data_batch_5.bin"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("cifar-10-batches-bin"), std::string::npos) << e;
  EXPECT_NE(e.find("cs.toronto.edu"), std::string::npos) << e;
  e = error_of([&] { CifarDataset(dir_.string(), false, CifarKind::cifar100); });
  EXPECT_NE(e.find("no cifar100 test file found: expected test.bin"), std::string::npos) << e;

  // Empty: named as such, with the record size (not "0 bytes is not a whole number").
  write_cifar10(dir_);
  fs::resize_file(dir_ / "data_batch_4.bin", 0);
  e = error_of([&] { CifarDataset(dir_.string(), true, CifarKind::cifar10); });
  EXPECT_NE(e.find("data_batch_4.bin: the file is empty (0 bytes); a cifar10 file holds records "
                   "of 3073 bytes"),
            std::string::npos)
      << e;

  // Truncated: not a whole number of records.
  write_cifar10(dir_);
  fs::resize_file(dir_ / "data_batch_3.bin", 4 * 3073 - 100);
  e = error_of([&] { CifarDataset(dir_.string(), true, CifarKind::cifar10); });
  EXPECT_NE(e.find("data_batch_3.bin: 12192 bytes is not a whole number of cifar10 records of "
                   "3073 bytes"),
            std::string::npos)
      << e;

  // A CIFAR-100 file read as CIFAR-10 fails on its size or labels; a bad label is named.
  write(dir_ / "test_batch.bin", 0, 2,
        [](int64_t s) { return std::vector<uint8_t>{uint8_t(9 + s)}; });
  e = error_of([&] { CifarDataset(dir_.string(), false, CifarKind::cifar10); });
  EXPECT_NE(e.find("test_batch.bin: record 1 has label 10, outside the 10 classes of cifar10"),
            std::string::npos)
      << e;

  write(dir_ / "test_batch.bin", 0, 2, [](int64_t s) { return std::vector<uint8_t>{uint8_t(s)}; });
  const CifarDataset ok(dir_.string(), false, CifarKind::cifar10);
  e = error_of([&] { ok.get_batch(std::vector<int64_t>{2}, 0); });
  EXPECT_NE(e.find("index 2 out of range [0, 2)"), std::string::npos) << e;
}

TEST(RandomCropFlip, DrawsArePureFunctionsOfSeedEpochAndIndex) {
  const RandomCropFlip a{.seed = 7}, b{.seed = 7}, other{.seed = 8};
  int flips = 0, differ_by_epoch = 0, differ_by_seed = 0;
  std::vector<int> dy_seen(9, 0);
  for (int64_t i = 0; i < 2000; ++i) {
    const auto d = a.draw(3, i);
    const auto again = b.draw(3, i);
    EXPECT_EQ(d.dy, again.dy);
    EXPECT_EQ(d.dx, again.dx);
    EXPECT_EQ(d.flip, again.flip);
    ASSERT_TRUE(d.dy >= 0 && d.dy <= 8 && d.dx >= 0 && d.dx <= 8) << d.dy << " " << d.dx;
    ++dy_seen[size_t(d.dy)];
    flips += d.flip;
    const auto next = a.draw(4, i);
    differ_by_epoch += next.dy != d.dy || next.dx != d.dx || next.flip != d.flip;
    const auto o = other.draw(3, i);
    differ_by_seed += o.dy != d.dy || o.dx != d.dx || o.flip != d.flip;
  }
  EXPECT_NEAR(flips, 1000, 120);
  for (int count : dy_seen) EXPECT_NEAR(count, 2000 / 9, 80);  // every offset, about evenly
  EXPECT_GT(differ_by_epoch, 1700);
  EXPECT_GT(differ_by_seed, 1700);
}

TEST(RandomCropFlip, ApplyCropsThePaddedImageThenMirrors) {
  // A 2-channel 3x4 image with distinct values; find draws of each kind and check every pixel.
  const int64_t c = 2, h = 3, w = 4;
  std::vector<float> src(size_t(c * h * w));
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i + 1);
  const RandomCropFlip t{.padding = 1, .seed = 5};
  bool saw_flip = false, saw_plain = false;
  for (int64_t index = 0; index < 40; ++index) {
    const auto d = t.draw(0, index);
    std::vector<float> dst(src.size(), -1.f);
    t.apply(src.data(), dst.data(), c, h, w, 0, index);
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) {
          // Crop of the 1-padded image at (dy, dx), then the mirror of that crop.
          const int64_t cx = d.flip ? w - 1 - x : x;
          const int64_t sy = y + d.dy - 1, sx = cx + d.dx - 1;
          const float want = (sy < 0 || sy >= h || sx < 0 || sx >= w)
                                 ? 0.f
                                 : src[size_t(ch * h * w + sy * w + sx)];
          EXPECT_EQ(dst[size_t(ch * h * w + y * w + x)], want)
              << "index " << index << " (" << ch << "," << y << "," << x << ")";
        }
    (d.flip ? saw_flip : saw_plain) = true;
  }
  EXPECT_TRUE(saw_flip && saw_plain);
  // No padding and no flip: the identity.
  const RandomCropFlip none{.padding = 0, .flip = false};
  std::vector<float> dst(src.size());
  none.apply(src.data(), dst.data(), c, h, w, 9, 3);
  EXPECT_EQ(dst, src);
}

TEST_F(CifarFiles, AugmentedTrainingBatchesCropAndFlipBeforeNormalizing) {
  write_cifar10(dir_);
  const RandomCropFlip aug{.seed = 11};
  const CifarDataset plain(dir_.string(), true, CifarKind::cifar10);
  const CifarDataset augmented(dir_.string(), true, CifarKind::cifar10, aug);
  std::vector<int64_t> all(14);
  for (int64_t i = 0; i < 14; ++i) all[size_t(i)] = i;
  int flipped = 0;
  for (int64_t epoch : {0, 1}) {
    const auto x = augmented.get_batch(all, epoch).inputs.to_vector<float>();
    for (int64_t s : all) {
      const auto d = aug.draw(epoch, s);
      flipped += d.flip;
      for (int64_t ch = 0; ch < 3; ++ch)
        for (int64_t y = 0; y < 32; ++y)
          for (int64_t xx = 0; xx < 32; ++xx) {
            const int64_t cx = d.flip ? 31 - xx : xx;
            const int64_t sy = y + d.dy - 4, sx = cx + d.dx - 4;
            const bool inside = sy >= 0 && sy < 32 && sx >= 0 && sx < 32;
            const uint8_t v = inside ? pixel(s, ch * 1024 + sy * 32 + sx) : 0;  // zero fill
            ASSERT_FLOAT_EQ(x[size_t(s * kPixels + ch * 1024 + y * 32 + xx)],
                            normalized(v, int(ch), CifarKind::cifar10))
                << "epoch " << epoch << " sample " << s << " (" << ch << "," << y << "," << xx
                << ")";
          }
    }
  }
  EXPECT_GT(flipped, 0);
  EXPECT_LT(flipped, 28);
  // Without augmentation the epoch changes nothing.
  EXPECT_EQ(plain.get_batch(std::vector<int64_t>{5}, 0).inputs.to_vector<float>(),
            plain.get_batch(std::vector<int64_t>{5}, 1).inputs.to_vector<float>());
}

TEST_F(CifarFiles, RegistryBuildsCifarAndAugmentsOnlyTrainingSets) {
  write_cifar10(dir_);
  const auto train = make_dataset("cifar10", dir_.string(), true, {.augment = true, .seed = 3});
  const auto test = make_dataset("cifar10", dir_.string(), false, {.augment = true, .seed = 3});
  EXPECT_EQ(train->size(), 14);
  EXPECT_EQ(train->num_classes(), 10);
  const std::vector<int64_t> first = {0};
  // Training batches change with the epoch (a new crop/flip); test batches do not.
  EXPECT_NE(train->get_batch(first, 0).inputs.to_vector<float>(),
            train->get_batch(first, 1).inputs.to_vector<float>());
  EXPECT_EQ(test->get_batch(first, 0).inputs.to_vector<float>(),
            test->get_batch(first, 1).inputs.to_vector<float>());
  const std::string e = error_of([&] { make_dataset("cifar-10", dir_.string(), true); });
  EXPECT_NE(e.find("expected mnist, fashion-mnist, cifar10, cifar100"), std::string::npos) << e;
}

}  // namespace
}  // namespace rg::data
