// A small CIFAR-10 directory for tests, in the real binary format (records of a label byte and
// 3072 channel-plane pixels) under the real file names: samples whose class (i % 10) shows as a
// bright channel-0 band, noise elsewhere from `seed`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace rg::testing {

inline void write_small_cifar10(const std::filesystem::path& dir, int per_train_file, int test,
                                uint32_t seed) {
  std::mt19937 gen(seed);
  const auto write = [&](const std::string& name, int count) {
    std::vector<uint8_t> bytes;
    for (int i = 0; i < count; ++i) {
      const int label = i % 10;
      bytes.push_back(uint8_t(label));
      for (int p = 0; p < 3 * 32 * 32; ++p) {
        const bool band = p < 1024 && (p / 32) / 3 == label;
        bytes.push_back(band ? uint8_t(230) : uint8_t(gen() % 96));
      }
    }
    std::ofstream(dir / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  };
  std::filesystem::create_directories(dir);
  for (int f = 1; f <= 5; ++f) write("data_batch_" + std::to_string(f) + ".bin", per_train_file);
  write("test_batch.bin", test);
}

}  // namespace rg::testing
