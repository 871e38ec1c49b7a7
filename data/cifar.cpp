// CIFAR loading (whole files, checked record by record) and batch assembly.
#include "data/cifar.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "kernels/error.h"

namespace rg::data {
namespace {

namespace fs = std::filesystem;

const char* kind_name(CifarKind kind) {
  return kind == CifarKind::cifar10 ? "cifar10" : "cifar100";
}

// The archive's folder inside `dir` (where the files are when `dir` is the unpacked archive's
// parent).
fs::path archive_dir(const std::string& dir, CifarKind kind) {
  return fs::path(dir) / (kind == CifarKind::cifar10 ? "cifar-10-batches-bin" : "cifar-100-binary");
}

// `name` in `dir` or in the archive's folder inside it; nullopt when in neither.
std::optional<fs::path> find_cifar_file(const std::string& dir, CifarKind kind,
                                        const std::string& name) {
  std::error_code ec;
  for (const fs::path& path : {fs::path(dir) / name, archive_dir(dir, kind) / name}) {
    if (fs::is_regular_file(path, ec)) return path;
  }
  return std::nullopt;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::vector<uint8_t> read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  RG_CHECK(in, path.string(), ": cannot open for reading");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  RG_CHECK(!in.bad(), path.string(), ": read error");
  return bytes;
}

}  // namespace

std::vector<std::string> CifarDataset::file_names(CifarKind kind, bool train) {
  if (kind == CifarKind::cifar100) return {train ? "train.bin" : "test.bin"};
  if (!train) return {"test_batch.bin"};
  std::vector<std::string> names;
  for (int i = 1; i <= 5; ++i) names.push_back("data_batch_" + std::to_string(i) + ".bin");
  return names;
}

Normalize CifarDataset::default_normalize(CifarKind kind) {
  // Per-channel mean and standard deviation of the training set's pixels in [0, 1].
  if (kind == CifarKind::cifar10) return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
  return {{0.5071f, 0.4865f, 0.4409f}, {0.2673f, 0.2564f, 0.2762f}};
}

CifarDataset::CifarDataset(const std::string& dir, bool train, CifarKind kind,
                           std::optional<RandomCropFlip> augment)
    : CifarDataset(dir, train, kind, default_normalize(kind), std::move(augment)) {}

CifarDataset::CifarDataset(const std::string& dir, bool train, CifarKind kind, Normalize normalize,
                           std::optional<RandomCropFlip> augment)
    : kind_(kind), normalize_(std::move(normalize)), augment_(std::move(augment)) {
  // Whichever of the split's files exist are read (a subset of the five CIFAR-10 training batches
  // is a smaller training set, not an error); the missing ones are named once on stderr.
  std::vector<fs::path> paths;
  for (const std::string& name : file_names(kind, train)) {
    if (auto path = find_cifar_file(dir, kind, name)) {
      paths.push_back(*path);
    } else {
      missing_files_.push_back(name);
    }
  }
  RG_CHECK(!paths.empty(), dir, ": no ", kind_name(kind), train ? " training" : " test",
           " file found: expected ", join(missing_files_), " there or in ",
           archive_dir(dir, kind).string(), "; download the binary ", kind_name(kind),
           " archive from https://www.cs.toronto.edu/~kriz/cifar.html, unpack it and pass its "
           "folder with --data-dir");
  if (!missing_files_.empty()) {
    std::fprintf(stderr, "CifarDataset: %s: reading %zu of %zu %s files; missing: %s\n",
                 dir.c_str(), paths.size(), paths.size() + missing_files_.size(),
                 train ? "training" : "test", join(missing_files_).c_str());
  }
  for (const fs::path& path : paths)
    append_records(read_all(path), kind, path.string(), labels_, images_);
}

void CifarDataset::append_records(std::span<const uint8_t> bytes, CifarKind kind,
                                  const std::string& name, std::vector<uint8_t>& labels,
                                  std::vector<uint8_t>& images) {
  const int64_t label_bytes = kind == CifarKind::cifar10 ? 1 : 2;
  const int64_t record = label_bytes + kPixels;
  const int64_t classes = kind == CifarKind::cifar10 ? 10 : 100;
  const auto size = int64_t(bytes.size());
  RG_CHECK(size > 0, name, ": the file is empty (0 bytes); a ", kind_name(kind),
           " file holds records of ", record, " bytes (an interrupted download?)");
  RG_CHECK(size % record == 0, name, ": ", size, " bytes is not a whole number of ",
           kind_name(kind), " records of ", record, " bytes (truncated or not a ", kind_name(kind),
           " binary file?)");
  const int64_t n = size / record;
  images.reserve(images.size() + size_t(n * kPixels));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* r = bytes.data() + i * record;
    const uint8_t label = r[label_bytes - 1];  // CIFAR-100: the fine label, after the coarse one
    RG_CHECK(label < classes, name, ": record ", i, " has label ", int(label), ", outside the ",
             classes, " classes of ", kind_name(kind));
    labels.push_back(label);
    images.insert(images.end(), r + label_bytes, r + record);
  }
}

Batch CifarDataset::get_batch(std::span<const int64_t> indices, int64_t epoch) const {
  const auto b = int64_t(indices.size());
  constexpr int64_t plane = kSide * kSide;
  Batch batch{Tensor::empty({b, kChannels, kSide, kSide}), Tensor::empty({b}, DType::i64), {}};
  float* x = batch.inputs.data<float>();
  int64_t* y = batch.targets.data<int64_t>();
  std::vector<float> pixels(static_cast<size_t>(kPixels));
  for (int64_t i = 0; i < b; ++i) {
    const int64_t idx = indices[size_t(i)];
    RG_CHECK(idx >= 0 && idx < size(), "CifarDataset: index ", idx, " out of range [0, ", size(),
             ")");
    const uint8_t* src = images_.data() + idx * kPixels;
    float* dst = x + i * kPixels;
    // As torchvision: crop and flip the [0, 1] image (zero fill), then normalize.
    float* scaled = augment_ ? pixels.data() : dst;
    bytes_to_unit(src, scaled, kPixels);
    if (augment_) augment_->apply(scaled, dst, kChannels, kSide, kSide, epoch, idx);
    normalize_.apply(dst, kChannels, plane);
    y[i] = labels_[size_t(idx)];
  }
  return batch;
}

}  // namespace rg::data
