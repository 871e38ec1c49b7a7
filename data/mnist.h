// MNIST and Fashion-MNIST from their IDX files (plain or .gz) in one directory, held in memory
// as bytes and converted to normalized f32 [B, 1, 28, 28] batches on demand.
#pragma once

#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/transforms.h"

namespace rg::data {

enum class MnistKind { mnist, fashion_mnist };

class MnistDataset final : public Dataset {
 public:
  // Reads {train|t10k}-{images-idx3|labels-idx1}-ubyte[.gz] from `dir`. The default Normalize
  // uses the training set's mean/std of the kind (MNIST: 0.1307/0.3081, Fashion: 0.2860/0.3530).
  MnistDataset(const std::string& dir, bool train, MnistKind kind = MnistKind::mnist);
  MnistDataset(const std::string& dir, bool train, Normalize normalize);

  int64_t size() const override { return int64_t(labels_.size()); }
  Batch get_batch(std::span<const int64_t> indices, int64_t epoch) const override;
  Shape sample_shape() const override { return {1, rows_, cols_}; }
  int64_t num_classes() const override { return 10; }
  static Normalize default_normalize(MnistKind kind);

 private:
  std::vector<uint8_t> images_;  // N * rows * cols
  std::vector<uint8_t> labels_;
  int64_t rows_ = 0, cols_ = 0;
  Normalize normalize_;
};

// The path of `stem` in `dir`, plain or with .gz; an error naming both when neither exists.
std::string find_idx_file(const std::string& dir, const std::string& stem);

}  // namespace rg::data
