// Per-sample transforms. Pure functions of their inputs (random ones of a seed, the epoch and the
// sample index), so a run's data is identical for any number of loader threads.
#pragma once

#include <cstdint>
#include <vector>

namespace rg::data {

// dst[i] = src[i] / 255: image bytes to [0, 1] floats (torchvision's ToTensor).
void bytes_to_unit(const uint8_t* src, float* dst, int64_t n);

// x = (x - mean[c]) / std[c] on a [C, plane] sample; a single mean/std applies to all channels.
struct Normalize {
  std::vector<float> mean;
  std::vector<float> std;

  void apply(float* sample, int64_t channels, int64_t plane) const;
};

// torchvision's RandomCrop(size, padding) with zero fill followed by RandomHorizontalFlip(0.5),
// the CIFAR training recipe: dst is a [C, H, W] window of src padded by `padding` on every side,
// mirrored left-right when the flip is drawn. The draws are a pure function of (seed, epoch,
// index), so a sample's augmentation does not depend on loader threads or batch composition.
struct RandomCropFlip {
  int64_t padding = 4;
  bool flip = true;
  uint64_t seed = 0;

  struct Draw {
    int64_t dy, dx;  // window offset in the padded image, in [0, 2 * padding]
    bool flip;
  };
  Draw draw(int64_t epoch, int64_t index) const;
  // src and dst must not overlap.
  void apply(const float* src, float* dst, int64_t channels, int64_t height, int64_t width,
             int64_t epoch, int64_t index) const;
};

}  // namespace rg::data
