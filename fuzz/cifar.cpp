// Fuzz harness: a CIFAR-10 and a CIFAR-100 binary file's records through
// CifarDataset::append_records.
#include "data/cifar.h"

#include <span>

#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using rg::data::CifarDataset;
  for (const auto kind : {rg::data::CifarKind::cifar10, rg::data::CifarKind::cifar100}) {
    rg::fuzz::expect_clean(size, [&] {
      std::vector<uint8_t> labels, images;
      CifarDataset::append_records(std::span(data, size), kind, "fuzz.bin", labels, images);
      rg::fuzz::require(images.size() == labels.size() * size_t(CifarDataset::kPixels),
                        "pixels and labels disagree");
    });
  }
  return 0;
}
