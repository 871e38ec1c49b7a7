// CIFAR-10 and CIFAR-100 from the "binary version" files of cs.toronto.edu/~kriz/cifar.html,
// held in memory as bytes and converted to normalized f32 [B, 3, 32, 32] batches on demand.
//   CIFAR-10:  data_batch_1.bin .. data_batch_5.bin (train), test_batch.bin; each record is
//              <label byte><3072 pixel bytes: the 1024 R, then G, then B of a row-major 32x32>.
//   CIFAR-100: train.bin, test.bin; each record is <coarse label><fine label><3072 pixel bytes>,
//              labelled by the fine label (100 classes), as torchvision does.
// The files may sit in `dir` itself or in the folder the archive unpacks to
// (cifar-10-batches-bin/, cifar-100-binary/). Whichever of a split's files exist are read (at least
// one must); an empty or truncated file is an error naming it, its size and the record size.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/transforms.h"

namespace rg::data {

enum class CifarKind { cifar10, cifar100 };

class CifarDataset final : public Dataset {
 public:
  // Normalizes with the training set's per-channel mean/std of the kind. `augment` (for training
  // sets) applies a random 32x32 crop of the 4-pixel zero-padded image and a horizontal flip.
  CifarDataset(const std::string& dir, bool train, CifarKind kind,
               std::optional<RandomCropFlip> augment = std::nullopt);
  CifarDataset(const std::string& dir, bool train, CifarKind kind, Normalize normalize,
               std::optional<RandomCropFlip> augment);

  int64_t size() const override { return int64_t(labels_.size()); }
  Batch get_batch(std::span<const int64_t> indices, int64_t epoch) const override;
  Shape sample_shape() const override { return {kChannels, kSide, kSide}; }
  int64_t num_classes() const override { return kind_ == CifarKind::cifar10 ? 10 : 100; }
  static Normalize default_normalize(CifarKind kind);
  // The files a split is read from, in order (names only).
  static std::vector<std::string> file_names(CifarKind kind, bool train);
  // The names of file_names() that were not found (and so not read); at least one was found.
  const std::vector<std::string>& missing_files() const { return missing_files_; }

  static constexpr int64_t kChannels = 3, kSide = 32, kPixels = kChannels * kSide * kSide;

  // Checks the records of one file's bytes (`name` names it in messages) and appends their labels
  // and pixels: what the constructor does with each file it reads, and what the fuzzer feeds.
  static void append_records(std::span<const uint8_t> bytes, CifarKind kind,
                             const std::string& name, std::vector<uint8_t>& labels,
                             std::vector<uint8_t>& images);

 private:
  CifarKind kind_;
  std::vector<uint8_t> images_;  // N * kPixels, channel planes
  std::vector<uint8_t> labels_;
  std::vector<std::string> missing_files_;
  Normalize normalize_;
  std::optional<RandomCropFlip> augment_;
};

}  // namespace rg::data
