// safetensors files: round trips of every dtype and odd shapes, the on-disk layout the format
// specifies (and files written the way Python's safetensors writes them), atomic replacement, and
// a clear error for every kind of damage.
#include "engine/serialization.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/ops/factory.h"
#include "support/errors.h"
#include "support/scratch_dir.h"

namespace rg {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

class Safetensors : public testing::ScratchDirTest {
 protected:
  std::string file(const std::string& name = "t.safetensors") { return (dir_ / name).string(); }

  static std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  // A file as Python writes it: header length, JSON, data; no padding or checksum required.
  static std::vector<uint8_t> raw_file(const std::string& json, const std::vector<uint8_t>& data) {
    std::vector<uint8_t> out;
    out.reserve(8 + json.size() + data.size());
    for (int b = 0; b < 8; ++b) out.push_back(uint8_t(uint64_t(json.size()) >> (8 * b)));
    for (char c : json) out.push_back(uint8_t(c));
    for (uint8_t d : data) out.push_back(d);
    return out;
  }
};

void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  EXPECT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << what;
}

TEST_F(Safetensors, EveryDtypeAndOddShapesRoundTripInOrderWithMetadata) {
  Generator gen(3);
  NamedTensors tensors = {
      {"w.f32", randn({3, 5}, gen)},
      {"a.f64", randn({7}, gen, DType::f64)},
      {"h.f16", randn({2, 2, 3}, gen).to(DType::f16)},
      {"b.bf16", randn({5}, gen).to(DType::bf16)},
      {"step", full({}, 12345678901.0, DType::i64)},
      {"i32", from_vector<int32_t>({-1, 2, -3}, {3})},
      {"bytes", from_vector<uint8_t>({0, 255, 7}, {3})},  // 3 bytes: the next one is unaligned
      {"empty", zeros({0, 4})},
      {"scalar", full({}, 2.5, DType::f64)},
  };
  save_safetensors(file(), tensors, {{"epoch", "3"}, {"note", "hello"}});
  const SafetensorsFile f = load_safetensors(file());
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(f.tensors[i].first, tensors[i].first);
    expect_same(f.tensors[i].second, tensors[i].second, tensors[i].first);
    EXPECT_TRUE(f.tensors[i].second.device().is_cpu());
  }
  EXPECT_EQ(f.metadata.at("epoch"), "3");
  EXPECT_EQ(f.metadata.at("note"), "hello");
  EXPECT_EQ(f.metadata.at("rg.crc32").size(), 8u);
}

TEST_F(Safetensors, TheLayoutIsTheFormatsAndPythonWrittenFilesLoad) {
  save_safetensors(file(), {{"x", from_vector<float>({1.f, 2.f}, {2})},
                            {"y", from_vector<int64_t>({7}, {1, 1})}});
  const std::vector<uint8_t> bytes = read_bytes(file());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "the data starts 8-byte aligned";
  const auto header =
      nlohmann::json::parse(std::string(bytes.begin() + 8, bytes.begin() + 8 + long(n)));
  EXPECT_EQ(header["x"]["dtype"], "F32");
  EXPECT_EQ(header["x"]["shape"], nlohmann::json::array({2}));
  EXPECT_EQ(header["x"]["data_offsets"], nlohmann::json::array({0, 8}));
  EXPECT_EQ(header["y"]["dtype"], "I64");
  EXPECT_EQ(header["y"]["data_offsets"], nlohmann::json::array({8, 16}));
  EXPECT_EQ(bytes.size(), 8 + n + 16);
  float x1 = 0;
  std::memcpy(&x1, bytes.data() + 8 + n + 4, 4);
  EXPECT_EQ(x1, 2.f);

  // Python's writer: keys in any order, tensors in any data order, no checksum.
  std::vector<uint8_t> data(12);
  const float f = 0.5f;
  const int64_t i = -9;
  std::memcpy(data.data(), &i, 8);
  std::memcpy(data.data() + 8, &f, 4);
  write_bytes(
      file("py.safetensors"),
      raw_file(R"({"__metadata__":{"format":"pt"},"f":{"dtype":"F32","shape":[1],)"
               R"("data_offsets":[8,12]},"i":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})",
               data));
  const SafetensorsFile py = load_safetensors(file("py.safetensors"));
  ASSERT_EQ(py.tensors.size(), 2u);
  EXPECT_EQ(py.tensors[0].first, "i");  // in data order
  EXPECT_EQ(py.tensors[0].second.item<int64_t>(), -9);
  EXPECT_EQ(py.tensors[1].second.item<float>(), 0.5f);
  EXPECT_EQ(py.metadata.at("format"), "pt");
}

TEST_F(Safetensors, SavingReplacesTheFileAtomicallyAndLeavesNoTemporaryFile) {
  save_safetensors(file(), {{"v", full({4}, 1.0)}});
  save_safetensors(file(), {{"v", full({2}, 3.0)}});
  const SafetensorsFile f = load_safetensors(file());
  EXPECT_EQ(f.tensors[0].second.to_vector<float>(), (std::vector<float>{3.f, 3.f}));
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 1) << "only the file itself";

  // A failed save (no such directory) is an error and creates nothing.
  const std::string missing = (dir_ / "no" / "such" / "x.safetensors").string();
  EXPECT_NE(error_of([&] {
              save_safetensors(missing, {{"v", full({1}, 1.0)}});
            }).find("cannot create"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "no"));
}

// The restart tests' partial-write hook runs once, with the header and part of the data in the
// temporary file and the old file untouched; a save that stops there (the hook throws here; the
// tests kill the process) leaves the old file. remove_save_temporaries removes what killed saves
// of that path left, and nothing else.
TEST_F(Safetensors, APartialWriteLeavesTheOldFileAndLeftoversOfThatPathAreRemoved) {
  save_safetensors(file(), {{"v", full({4}, 1.0)}});
  const std::vector<uint8_t> old = read_bytes(file());
  int calls = 0;
  set_partial_write_hook([&] {
    ++calls;
    std::vector<fs::path> tmp;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename() != "t.safetensors") tmp.push_back(e.path());
    ASSERT_EQ(tmp.size(), 1u);
    EXPECT_EQ(tmp[0].filename().string().rfind("t.safetensors.tmp.", 0), 0u) << tmp[0];
    const auto size = fs::file_size(tmp[0]);
    EXPECT_GT(size, 8u + 64u) << "the header and some data";
    EXPECT_LT(size, 8u + 64u + 2 * 4096u) << "not all of the data";
    EXPECT_EQ(read_bytes(file()), old);
    throw Error("stopped half-way");
  });
  EXPECT_EQ(error_of([&] {
              save_safetensors(file(), {{"a", full({1024}, 2.0)}, {"b", full({1024}, 3.0)}});
            }),
            "stopped half-way");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(read_bytes(file()), old);
  save_safetensors(file(), {{"v", full({2}, 3.0)}});  // the hook was used up
  EXPECT_EQ(calls, 1);

  for (const char* name :
       {"t.safetensors.tmp.a1B2c3", "t.safetensors.tmp.zzzzzz", "t.safetensors.tmp.x",
        "u.safetensors.tmp.a1B2c3", "t.safetensors.tmpXa1B2c3"})
    write_bytes(file(name), {1, 2, 3});
  EXPECT_EQ(remove_save_temporaries(file()), 2);
  EXPECT_FALSE(fs::exists(file("t.safetensors.tmp.a1B2c3")));
  EXPECT_FALSE(fs::exists(file("t.safetensors.tmp.zzzzzz")));
  for (const char* kept : {"t.safetensors", "t.safetensors.tmp.x", "u.safetensors.tmp.a1B2c3",
                           "t.safetensors.tmpXa1B2c3"})
    EXPECT_TRUE(fs::exists(file(kept))) << kept;
  EXPECT_EQ(remove_save_temporaries(file()), 0);
}

TEST_F(Safetensors, BadNamesAreRefused) {
  const Tensor t = full({1}, 1.0);
  EXPECT_NE(error_of([&] {
              save_safetensors(file(), {{"a", t}, {"a", t}});
            }).find("the name 'a' appears twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              save_safetensors(file(), {{"", t}});
            }).find("invalid tensor name"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              save_safetensors(file(), {{"__metadata__", t}});
            }).find("invalid tensor name"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              save_safetensors(file(), {{"a", t}}, {{"rg.crc32", "0"}});
            }).find("is reserved"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(file()));
}

TEST_F(Safetensors, EveryKindOfDamageIsAClearError) {
  save_safetensors(file(), {{"x", from_vector<float>({1.f, 2.f, 3.f}, {3})}});
  const std::vector<uint8_t> good = read_bytes(file());
  const auto load_error = [&](const std::vector<uint8_t>& bytes) {
    write_bytes(file("bad"), bytes);
    return error_of([&] { load_safetensors(file("bad")); });
  };
  // A flipped data bit: the checksum catches it.
  std::vector<uint8_t> flipped = good;
  flipped.back() ^= 0x10;
  EXPECT_NE(load_error(flipped).find("(the file is corrupt)"), std::string::npos);
  // Truncated data, a truncated header, a tiny file.
  EXPECT_NE(load_error({good.begin(), good.end() - 4}).find("outside the 8 data bytes"),
            std::string::npos);
  EXPECT_NE(load_error({good.begin(), good.begin() + 20}).find("header length"), std::string::npos);
  EXPECT_NE(load_error({1, 2, 3}).find("shorter than the 8-byte header length"), std::string::npos);
  // Headers that are not the format.
  EXPECT_NE(load_error(raw_file("{nope", {})).find("not valid JSON"), std::string::npos);
  EXPECT_NE(load_error(raw_file("[1]", {})).find("not a JSON object"), std::string::npos);
  EXPECT_NE(load_error(raw_file(R"({"x":{"dtype":"F32"}})", {})).find("needs dtype, shape"),
            std::string::npos);
  EXPECT_NE(load_error(raw_file(R"({"x":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})",
                                std::vector<uint8_t>(8)))
                .find("unsupported dtype \"C64\""),
            std::string::npos);
  EXPECT_NE(load_error(raw_file(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                                std::vector<uint8_t>(8)))
                .find("8 bytes for shape [3] of F32"),
            std::string::npos);
  EXPECT_NE(load_error(raw_file(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                                std::vector<uint8_t>(4)))
                .find("non-integer or negative size"),
            std::string::npos);
  // A shape whose byte count overflows 64 bits (it would wrap to 0 and pass as empty).
  EXPECT_NE(
      load_error(
          raw_file(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                   {}))
          .find("is too large"),
      std::string::npos);
  // Overlap, a hole, and bytes nobody owns.
  EXPECT_NE(load_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                std::vector<uint8_t>(8)))
                .find("overlapping tensors or a hole"),
            std::string::npos);
  EXPECT_NE(load_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                std::vector<uint8_t>(8)))
                .find("starts at byte 4 of the data, expected 0"),
            std::string::npos);
  EXPECT_NE(load_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                std::vector<uint8_t>(8)))
                .find("the tensors cover 4 of the 8 data bytes"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_safetensors(file("missing")); }).find("cannot open for reading"),
            std::string::npos);
}

}  // namespace
}  // namespace rg
