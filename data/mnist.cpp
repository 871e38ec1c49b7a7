// MNIST loading and batch assembly.
#include "data/mnist.h"

#include <filesystem>

#include "data/idx.h"
#include "kernels/error.h"

namespace rg::data {

std::string find_idx_file(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  const fs::path plain = fs::path(dir) / stem;
  std::error_code ec;
  if (fs::exists(plain, ec)) return plain.string();
  const fs::path gz = fs::path(dir) / (stem + ".gz");
  if (fs::exists(gz, ec)) return gz.string();
  RG_FAIL(plain.string(), ": file not found (nor ", gz.string(),
          "); run scripts/get-data.sh mnist|fashion-mnist, or pass the right --data-dir");
}

Normalize MnistDataset::default_normalize(MnistKind kind) {
  return kind == MnistKind::mnist ? Normalize{{0.1307f}, {0.3081f}}
                                  : Normalize{{0.2860f}, {0.3530f}};
}

MnistDataset::MnistDataset(const std::string& dir, bool train, MnistKind kind)
    : MnistDataset(dir, train, default_normalize(kind)) {}

MnistDataset::MnistDataset(const std::string& dir, bool train, Normalize normalize)
    : normalize_(std::move(normalize)) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string image_path = find_idx_file(dir, prefix + "-images-idx3-ubyte");
  const std::string label_path = find_idx_file(dir, prefix + "-labels-idx1-ubyte");
  IdxArray images = read_idx_u8(image_path, 3);
  IdxArray labels = read_idx_u8(label_path, 1);
  RG_CHECK(images.dims[0] == labels.dims[0], image_path, " has ", images.dims[0], " images but ",
           label_path, " has ", labels.dims[0], " labels");
  RG_CHECK(images.dims[1] > 0 && images.dims[2] > 0, image_path, ": empty image dimensions");
  for (size_t i = 0; i < labels.values.size(); ++i) {
    RG_CHECK(labels.values[i] < 10, label_path, ": label ", int(labels.values[i]), " at index ", i,
             " is not a digit class 0-9");
  }
  rows_ = images.dims[1];
  cols_ = images.dims[2];
  images_ = std::move(images.values);
  labels_ = std::move(labels.values);
}

Batch MnistDataset::get_batch(std::span<const int64_t> indices, int64_t /*epoch*/) const {
  const int64_t b = int64_t(indices.size());
  const int64_t plane = rows_ * cols_;
  Batch batch{Tensor::empty({b, 1, rows_, cols_}), Tensor::empty({b}, DType::i64), {}};
  float* x = batch.inputs.data<float>();
  int64_t* y = batch.targets.data<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t idx = indices[size_t(i)];
    RG_CHECK(idx >= 0 && idx < size(), "MnistDataset: index ", idx, " out of range [0, ", size(),
             ")");
    const uint8_t* src = images_.data() + idx * plane;
    float* dst = x + i * plane;
    bytes_to_unit(src, dst, plane);
    normalize_.apply(dst, 1, plane);
    y[i] = labels_[size_t(idx)];
  }
  return batch;
}

}  // namespace rg::data
