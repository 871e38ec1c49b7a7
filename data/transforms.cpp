// Normalize over channel planes; random crop and flip from Philox draws.
#include "data/transforms.h"

#include "kernels/error.h"
#include "kernels/philox.h"

namespace rg::data {

void bytes_to_unit(const uint8_t* src, float* dst, int64_t n) {
  // A multiplication by 1/255 (torchvision divides; the two differ by at most an ulp).
  for (int64_t k = 0; k < n; ++k) dst[k] = float(src[k]) * (1.0f / 255.0f);
}

void Normalize::apply(float* sample, int64_t channels, int64_t plane) const {
  RG_CHECK(!mean.empty() && mean.size() == std.size(),
           "Normalize: mean and std must be non-empty "
           "and of the same length (",
           mean.size(), " vs ", std.size(), ")");
  RG_CHECK(mean.size() == 1 || int64_t(mean.size()) == channels, "Normalize: ", mean.size(),
           " means for ", channels, " channels");
  for (int64_t c = 0; c < channels; ++c) {
    const size_t k = mean.size() == 1 ? 0 : size_t(c);
    const float m = mean[k], inv = 1.0f / std[k];
    float* p = sample + c * plane;
    for (int64_t i = 0; i < plane; ++i) p[i] = (p[i] - m) * inv;  // within an ulp of a division
  }
}

RandomCropFlip::Draw RandomCropFlip::draw(int64_t epoch, int64_t index) const {
  RG_CHECK(padding >= 0, "RandomCropFlip: padding must be >= 0, got ", padding);
  RG_CHECK(epoch >= 0 && index >= 0 && index < (int64_t{1} << 32),
           "RandomCropFlip: epoch and index must be >= 0 and index < 2^32, got ", epoch, ", ",
           index);
  // One Philox block per (epoch, index): the counter is epoch * 2^32 + index.
  // Keyed apart from the samplers' streams (which use `seed` itself), so crops do not correlate
  // with the shuffle of the same seed.
  constexpr uint64_t kAugmentKey = 0x9E3779B97F4A7C15ull;
  const philox::U32x4 r =
      philox::block(seed ^ kAugmentKey, (uint64_t(epoch) << 32) | uint64_t(index));
  const auto positions = uint32_t(2 * padding + 1);
  return {int64_t(r.v[0] % positions), int64_t(r.v[1] % positions), flip && (r.v[2] & 1u) != 0};
}

void RandomCropFlip::apply(const float* src, float* dst, int64_t channels, int64_t height,
                           int64_t width, int64_t epoch, int64_t index) const {
  const Draw d = draw(epoch, index);
  // Output pixel (y, x) reads padded pixel (y + dy, x' + dx), i.e. src (y + dy - padding, ...),
  // where x' is x or its mirror; outside src it is the zero fill.
  for (int64_t c = 0; c < channels; ++c) {
    const float* s = src + c * height * width;
    float* o = dst + c * height * width;
    for (int64_t y = 0; y < height; ++y) {
      const int64_t sy = y + d.dy - padding;
      for (int64_t x = 0; x < width; ++x) {
        const int64_t xc = d.flip ? width - 1 - x : x;
        const int64_t sx = xc + d.dx - padding;
        const bool inside = sy >= 0 && sy < height && sx >= 0 && sx < width;
        o[y * width + x] = inside ? s[sy * width + sx] : 0.0f;
      }
    }
  }
}

}  // namespace rg::data
