// IDX files (the MNIST format) for tests: the bytes of one array, and a small MNIST-shaped
// dataset written into a directory under the real file names.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace rg::testing {

inline std::vector<uint8_t> be32(uint32_t v) {
  return {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
}

// magic (0x801 labels, 0x803 images), big-endian dims, then the u8 payload.
inline std::vector<uint8_t> idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims,
                                      const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out = be32(magic);
  for (uint32_t d : dims) {
    auto b = be32(d);
    out.insert(out.end(), b.begin(), b.end());
  }
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

inline void write_file(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// train-/t10k- images and labels of 28x28 samples whose class (i % 10) shows as a bright band,
// so a model can learn them; noise elsewhere from `seed`.
inline void write_small_mnist(const std::filesystem::path& dir, uint32_t train, uint32_t test,
                              uint32_t seed) {
  std::mt19937 gen(seed);
  for (const auto& [prefix, n] :
       {std::pair<std::string, uint32_t>{"train", train}, {"t10k", test}}) {
    std::vector<uint8_t> images(size_t(n) * 784), labels(n);
    for (uint32_t i = 0; i < n; ++i) {
      labels[i] = uint8_t(i % 10);
      for (uint32_t p = 0; p < 784; ++p) {
        const bool band = (p / 28) / 3 == labels[i] % 9;
        images[size_t(i) * 784 + p] = uint8_t(band ? 200 + gen() % 56 : gen() % 60);
      }
    }
    write_file(dir / (prefix + "-images-idx3-ubyte"), idx_bytes(0x803, {n, 28, 28}, images));
    write_file(dir / (prefix + "-labels-idx1-ubyte"), idx_bytes(0x801, {n}, labels));
  }
}

}  // namespace rg::testing
