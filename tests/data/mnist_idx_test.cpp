// IDX/MNIST reading from files the test writes: valid plain and gzip files, and every kind of bad
// input (missing, wrong magic, wrong rank, truncated, trailing bytes, count mismatch, bad label).
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/idx.h"
#include "data/mnist.h"
#include "kernels/error.h"
#include "support/errors.h"
#include "support/idx_files.h"
#include "support/scratch_dir.h"

namespace rg::data {
namespace {

namespace fs = std::filesystem;
using rg::testing::error_of;

using rg::testing::be32;
using rg::testing::idx_bytes;

class MnistFiles : public rg::testing::ScratchDirTest {
 protected:
  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    return path;
  }
  std::string write_gz(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), unsigned(bytes.size()));
    gzclose(f);
    return path;
  }
  // Two 2x3 images with pixel values 0..11 and labels {7, 3}.
  void write_valid_set(const std::string& prefix, bool gz) {
    std::vector<uint8_t> pixels(12);
    for (int i = 0; i < 12; ++i) pixels[size_t(i)] = uint8_t(i * 20);
    auto images = idx_bytes(0x803, {2, 2, 3}, pixels);
    auto labels = idx_bytes(0x801, {2}, {7, 3});
    if (gz) {
      write_gz(prefix + "-images-idx3-ubyte.gz", images);
      write_gz(prefix + "-labels-idx1-ubyte.gz", labels);
    } else {
      write(prefix + "-images-idx3-ubyte", images);
      write(prefix + "-labels-idx1-ubyte", labels);
    }
  }
};

TEST_F(MnistFiles, ReadsPlainAndGzipIdentically) {
  write_valid_set("train", /*gz=*/false);
  write_valid_set("t10k", /*gz=*/true);
  MnistDataset train(dir_.string(), true, Normalize{{0.0f}, {1.0f}});
  MnistDataset test(dir_.string(), false, Normalize{{0.0f}, {1.0f}});
  ASSERT_EQ(train.size(), 2);
  ASSERT_EQ(test.size(), 2);
  EXPECT_EQ(train.sample_shape(), (Shape{1, 2, 3}));
  const std::vector<int64_t> idx = {1, 0};
  Batch a = train.get_batch(idx, 0), b = test.get_batch(idx, 0);
  EXPECT_EQ(a.inputs.shape(), (Shape{2, 1, 2, 3}));
  EXPECT_EQ(a.targets.to_vector<int64_t>(), (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(a.inputs.to_vector<float>(), b.inputs.to_vector<float>());
  EXPECT_FLOAT_EQ(a.inputs.to_vector<float>()[0], 120.0f / 255.0f);  // image 1, pixel 0 = 6*20
}

TEST_F(MnistFiles, NormalizeUsesMeanAndStd) {
  write_valid_set("train", false);
  MnistDataset ds(dir_.string(), true, Normalize{{0.5f}, {0.25f}});
  const std::vector<int64_t> idx = {0};
  const auto v = ds.get_batch(idx, 0).inputs.to_vector<float>();
  EXPECT_FLOAT_EQ(v[0], (0.0f - 0.5f) / 0.25f);
  EXPECT_FLOAT_EQ(v[5], (100.0f / 255.0f - 0.5f) / 0.25f);
}

TEST_F(MnistFiles, MissingFileNamesPathAndScript) {
  const std::string msg = error_of([&] { MnistDataset(dir_.string(), true); });
  EXPECT_NE(msg.find("train-images-idx3-ubyte"), std::string::npos) << msg;
  EXPECT_NE(msg.find("get-data.sh"), std::string::npos) << msg;
}

TEST_F(MnistFiles, WrongMagic) {
  const auto path = write("x", idx_bytes(0x12345678, {1}, {0}));
  const std::string msg = error_of([&] { read_idx_u8(path, 1); });
  EXPECT_NE(msg.find("not an IDX file"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

TEST_F(MnistFiles, WrongRankAndType) {
  const auto labels = write("labels", idx_bytes(0x801, {2}, {1, 2}));
  EXPECT_NE(error_of([&] { read_idx_u8(labels, 3); }).find("1 dimensions, expected 3"),
            std::string::npos);
  const auto floats = write("floats", idx_bytes(0xD01, {1}, {0, 0, 0, 0}));
  EXPECT_NE(error_of([&] { read_idx_u8(floats, 1); }).find("not unsigned byte"), std::string::npos);
}

TEST_F(MnistFiles, TruncatedHeaderAndPayload) {
  const auto tiny = write("tiny", {0, 0});
  EXPECT_NE(error_of([&] { read_idx_u8(tiny, 1); }).find("truncated"), std::string::npos);
  auto header_only = be32(0x803);
  const auto partial_header = write("ph", header_only);
  EXPECT_NE(error_of([&] { read_idx_u8(partial_header, 3); }).find("truncated IDX header"),
            std::string::npos);
  const auto short_payload = write("short", idx_bytes(0x803, {2, 2, 3}, std::vector<uint8_t>(11)));
  const std::string msg = error_of([&] { read_idx_u8(short_payload, 3); });
  EXPECT_NE(msg.find("promises 12 values but only 11"), std::string::npos) << msg;
}

TEST_F(MnistFiles, TruncatedGzipStream) {
  auto bytes = idx_bytes(0x801, {1000}, std::vector<uint8_t>(1000, 1));
  const std::string full = write_gz("full.gz", bytes);
  std::ifstream in(full, std::ios::binary);
  std::vector<uint8_t> gz((std::istreambuf_iterator<char>(in)), {});
  gz.resize(gz.size() / 2);
  const auto cut = write("cut.gz", gz);
  const std::string msg = error_of([&] { read_idx_u8(cut, 1); });
  EXPECT_FALSE(msg.empty());
  EXPECT_NE(msg.find(cut), std::string::npos) << msg;
}

TEST_F(MnistFiles, TrailingBytes) {
  const auto path = write("trail", idx_bytes(0x801, {2}, {1, 2, 3}));
  EXPECT_NE(error_of([&] { read_idx_u8(path, 1); }).find("trailing"), std::string::npos);
}

TEST_F(MnistFiles, ImageLabelCountMismatch) {
  write("train-images-idx3-ubyte", idx_bytes(0x803, {2, 2, 3}, std::vector<uint8_t>(12)));
  write("train-labels-idx1-ubyte", idx_bytes(0x801, {3}, {1, 2, 3}));
  const std::string msg = error_of([&] { MnistDataset(dir_.string(), true); });
  EXPECT_NE(msg.find("2 images"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 labels"), std::string::npos) << msg;
}

TEST_F(MnistFiles, LabelOutOfRange) {
  write("train-images-idx3-ubyte", idx_bytes(0x803, {2, 2, 3}, std::vector<uint8_t>(12)));
  write("train-labels-idx1-ubyte", idx_bytes(0x801, {2}, {1, 12}));
  EXPECT_NE(error_of([&] { MnistDataset(dir_.string(), true); }).find("label 12 at index 1"),
            std::string::npos);
}

}  // namespace
}  // namespace rg::data
