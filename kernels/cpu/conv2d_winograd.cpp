// Our Winograd convolution's drivers (see conv2d_winograd.h): planning, blocks of tiles, the
// GEMMs, and the choice of transform code; the generic build of the transforms lives here too.
#define RG_WINOGRAD_ISA generic
#include "kernels/cpu/conv2d_winograd.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/conv2d_winograd_kernels.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"

namespace rg::kernels::cpu {
namespace winograd {

const Kernels& generic_kernels() { return generic::kTable; }

namespace {

// Transformed data of one block of tiles (inputs and outputs of its 36 GEMMs) stays within
// kBlockBytes, so that the GEMMs find their operands in the caches the transforms just wrote.
// Output channels go in slices whose transformed filters (forward) or gradient sums (weight
// gradient), 36 x rows x c floats, stay within kSliceBytes: ResNet's 512-channel layers would
// otherwise need 38 MiB of each at once.
constexpr int64_t kBlockBytes = int64_t(2) << 20;
constexpr int64_t kSliceBytes = int64_t(8) << 20;
constexpr int64_t kPoints = 36;
constexpr int64_t kMinChannels = 16;

std::atomic<WinogradIsa>& isa_choice() {
  static std::atomic<WinogradIsa> isa{WinogradIsa::automatic};
  return isa;
}

const Kernels& kernels() {
  const WinogradIsa isa = isa_choice().load(std::memory_order_relaxed);
  if (isa != WinogradIsa::generic && winograd_avx2_available()) return *avx2_kernels();
  return generic_kernels();
}

int64_t round8(int64_t n) { return (n + 7) / 8 * 8; }

std::unique_ptr<float[]> scratch(int64_t n) {
  return std::make_unique_for_overwrite<float[]>(size_t(n));
}

// Tiles in order (image, tile row, tile column), in blocks of `block` tiles; output channels in
// slices of `rows`.
struct Plan {
  int64_t tile_rows, tile_cols, tiles, block, rows;
  Plan(const Shape& s, int64_t n) {
    tile_rows = (s.ho + 3) / 4;
    tile_cols = (s.wo + 3) / 4;
    tiles = n * tile_rows * tile_cols;
    const int64_t per_tile = kPoints * int64_t(sizeof(float)) * (s.c + s.o);
    block = std::min(round8(tiles), std::max<int64_t>(8, kBlockBytes / per_tile / 8 * 8));
    const int64_t per_row = kPoints * int64_t(sizeof(float)) * s.c;
    const int64_t slices = std::max<int64_t>(1, (s.o * per_row + kSliceBytes - 1) / kSliceBytes);
    rows = (s.o + slices - 1) / slices;
  }
  int64_t fill(int64_t t0, Tile* out) const {
    const int64_t count = std::min(block, tiles - t0);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t t = t0 + i, per_image = tile_rows * tile_cols, r = t % per_image;
      out[i] = Tile{t / per_image, r / tile_cols * 4, r % tile_cols * 4};
    }
    return count;
  }
};

// y = conv(x, f) + bias for the stride-1 3x3 convolution `s` over n images, where the filters
// f are w ([o][c]) or, `flipped`, w ([c][o]) turned by 180 degrees; `cl`: x, y and w are
// channels-last (the transforms differ, the transformed data and the GEMMs do not).
void forward(const Shape& s, int64_t n, const float* x, const float* w, bool flipped,
             const float* bias, float* y, bool cl) {
  const Kernels& k = kernels();
  const Plan plan(s, n);
  const bool one_slice = plan.rows == s.o;
  auto u = scratch(kPoints * plan.rows * s.c);
  auto transform_filters = [&](int64_t base, int64_t rows) {
    parallel_for(base, base + rows, 1, [&](int64_t lo, int64_t hi) {
      (cl ? k.filter_cl : k.filter)(w, s.o, s.c, flipped, base, rows, lo, hi, u.get());
    });
  };
  auto v = scratch(kPoints * s.c * plan.block);
  auto m = scratch(kPoints * plan.rows * plan.block);
  std::vector<Tile> tiles(size_t(plan.block));
  SingleThreadedBlas single;
  auto transform_inputs = [&](int64_t t0) {
    const int64_t count = plan.fill(t0, tiles.data());
    if (cl) {
      parallel_for(0, round8(count) / 8, 1, [&](int64_t lo, int64_t hi) {
        k.input_cl(s, x, tiles.data(), count, round8(count), lo, hi, v.get());
      });
      return;
    }
    parallel_for(0, s.c, 1, [&](int64_t lo, int64_t hi) {
      auto pad = scratch(input_scratch_floats(s, count));
      k.input(s, x, tiles.data(), count, round8(count), lo, hi, v.get(), pad.get());
    });
  };
  auto multiply_and_write = [&](int64_t t0, int64_t base, int64_t rows) {
    const int64_t count = std::min(plan.block, plan.tiles - t0), width = round8(count);
    parallel_for(0, kPoints, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        gemm<float>(false, false, rows, width, s.c, 1.0f, u.get() + p * rows * s.c, s.c,
                    v.get() + p * s.c * width, width, 0.0f, m.get() + p * rows * width, width);
      }
    });
    if (cl) {
      parallel_for(0, width / 8, 1, [&](int64_t lo, int64_t hi) {
        k.output_cl(s, m.get(), tiles.data(), count, width, bias, base, rows, lo, hi, y);
      });
      return;
    }
    parallel_for(base, base + rows, 1, [&](int64_t lo, int64_t hi) {
      k.output(s, m.get(), tiles.data(), count, width, bias, base, rows, lo, hi, y);
    });
  };
  if (one_slice || plan.tiles <= plan.block) {
    // Every transform made once: the filters up front, or the one block's inputs.
    if (one_slice) transform_filters(0, s.o);
    for (int64_t t0 = 0; t0 < plan.tiles; t0 += plan.block) {
      transform_inputs(t0);
      for (int64_t base = 0; base < s.o; base += plan.rows) {
        const int64_t rows = std::min(plan.rows, s.o - base);
        if (!one_slice) transform_filters(base, rows);
        multiply_and_write(t0, base, rows);
      }
    }
  } else {
    // Several slices and several blocks: the inputs are transformed again for every slice
    // (slices are few: repeating the filters' transform for every block costs more).
    for (int64_t base = 0; base < s.o; base += plan.rows) {
      const int64_t rows = std::min(plan.rows, s.o - base);
      transform_filters(base, rows);
      for (int64_t t0 = 0; t0 < plan.tiles; t0 += plan.block) {
        transform_inputs(t0);
        multiply_and_write(t0, base, rows);
      }
    }
  }
}

Shape shape_of(const Conv2dGeometry& g) { return {g.c, g.h, g.w, g.o, g.ho, g.wo, g.ph, g.pw}; }

}  // namespace
}  // namespace winograd

namespace {

std::atomic<bool>& winograd_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("RG_CONV_ALGO");
    return v == nullptr || std::string(v) != "direct";
  }()};
  return on;
}

}  // namespace

bool winograd_enabled() { return winograd_flag().load(std::memory_order_relaxed); }
void set_winograd_enabled(bool enabled) { winograd_flag().store(enabled); }

bool winograd_applies(const Conv2dGeometry& g) {
  return g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.ph >= 0 &&
         g.ph <= 2 && g.pw >= 0 && g.pw <= 2 && g.n > 0 && g.c >= winograd::kMinChannels &&
         g.o >= winograd::kMinChannels && g.ho > 0 && g.wo > 0;
}

void set_winograd_isa(WinogradIsa isa) { winograd::isa_choice().store(isa); }

bool winograd_avx2_available() {
  static const bool available = winograd::avx2_kernels() != nullptr &&
                                __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return available;
}

void winograd_conv2d_forward(const Conv2dGeometry& g, const float* x, const float* w,
                             const float* bias, float* y) {
  winograd::forward(winograd::shape_of(g), g.n, x, w, false, bias, y, g.channels_last);
}

void winograd_conv2d_input_grad(const Conv2dGeometry& g, const float* w, const float* gy,
                                float* gx) {
  // gx = gy, padded by 2 - p, correlated with the filters transposed to [c][o] and turned.
  const winograd::Shape t{g.o, g.ho, g.wo, g.c, g.h, g.w, 2 - g.ph, 2 - g.pw};
  winograd::forward(t, g.n, gy, w, true, nullptr, gx, g.channels_last);
}

void winograd_conv2d_weight_grad(const Conv2dGeometry& g, const float* x, const float* gy,
                                 float* gw) {
  using namespace winograd;
  const Kernels& k = kernels();
  const Shape s = shape_of(g);
  const Plan plan(s, g.n);
  // With every tile in one block, the input's transform is made once for all slices.
  const bool one_block = plan.tiles <= plan.block, cl = g.channels_last;
  auto xt = scratch(kPoints * s.c * plan.block);
  auto gyt = scratch(kPoints * plan.rows * plan.block);
  auto sum = scratch(kPoints * plan.rows * s.c);
  std::vector<Tile> tiles(size_t(plan.block));
  SingleThreadedBlas single;
  for (int64_t base = 0; base < s.o; base += plan.rows) {
    const int64_t rows = std::min(plan.rows, s.o - base);
    for (int64_t t0 = 0; t0 < plan.tiles; t0 += plan.block) {
      const int64_t count = plan.fill(t0, tiles.data()), width = round8(count);
      const int64_t inputs = one_block && base > 0 ? 0 : s.c;
      if (cl) {
        // Groups of eight tiles: the input's transform is one row of tiles per channel.
        parallel_for(0, width / 8, 1, [&](int64_t lo, int64_t hi) {
          if (inputs > 0) k.input_cl(s, x, tiles.data(), count, width, lo, hi, xt.get());
          k.grad_cl(s, gy, tiles.data(), count, base, rows, 8 * lo, std::min(count, 8 * hi),
                    gyt.get());
        });
      } else {
        parallel_for(0, inputs + rows, 1, [&](int64_t lo, int64_t hi) {
          // Channels [0, inputs) of the input, then the slice's channels of the gradient.
          if (lo < inputs) {
            auto pad = scratch(input_scratch_floats(s, count));
            k.input(s, x, tiles.data(), count, width, lo, std::min(hi, inputs), xt.get(),
                    pad.get());
          }
          if (hi > inputs) {
            k.grad(s, gy, tiles.data(), count, width, base, rows,
                   base + std::max(lo, inputs) - inputs, base + hi - inputs, gyt.get());
          }
        });
      }
      const float beta = t0 == 0 ? 0.0f : 1.0f;
      parallel_for(0, kPoints, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t p = lo; p < hi; ++p) {
          float* sp = sum.get() + p * rows * s.c;
          if (cl) {
            gemm<float>(true, true, rows, s.c, count, 1.0f, gyt.get() + p * count * rows, rows,
                        xt.get() + p * s.c * width, width, beta, sp, s.c);
          } else {
            gemm<float>(false, true, rows, s.c, width, 1.0f, gyt.get() + p * rows * width, width,
                        xt.get() + p * s.c * width, width, beta, sp, s.c);
          }
        }
      });
    }
    parallel_for(base, base + rows, 1, [&](int64_t lo, int64_t hi) {
      (cl ? k.weight_cl : k.weight)(s, sum.get(), base, rows, lo, hi, gw);
    });
  }
}

}  // namespace rg::kernels::cpu
