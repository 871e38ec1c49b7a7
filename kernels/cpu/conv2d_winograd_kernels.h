// The transforms of the Winograd convolution (kernels/cpu/conv2d_winograd.h) on raw pointers,
// eight tiles at a time in GCC vector types. This header's bodies are compiled twice: by
// conv2d_winograd.cpp for any x86-64 and by conv2d_winograd_avx2.cpp with -mavx2 -mfma, each
// inside its own namespace (RG_WINOGRAD_ISA); the driver picks one table at run time. The bodies
// call no standard-library function (only constexpr data of std::array), so no AVX2 copy of a
// shared inline function can be linked into the generic path.
#pragma once

#include <cstdint>

namespace rg::kernels::cpu::winograd {

// One tile of a block: its image and the top-left corner of its 4x4 output tile.
struct Tile {
  int64_t image;
  int64_t oy, ox;
};

// Geometry of one call: a stride-1 3x3 convolution with padding (ph, pw).
struct Shape {
  int64_t c, h, w;    // input channels and size
  int64_t o, ho, wo;  // output channels and size
  int64_t ph, pw;
};

struct Kernels {
  // V[(p * C + c) * tbp + t] = (BT d_t B)[p] for the 6x6 input patch d_t of tile t (zero outside
  // the image), channels [c0, c1); tiles t >= tb are zero. tbp is a multiple of 8.
  // `pad` is scratch of input_scratch_floats(s, tb) floats.
  void (*input)(const Shape& s, const float* x, const Tile* tiles, int64_t tb, int64_t tbp,
                int64_t c0, int64_t c1, float* v, float* pad);
  // The transformed matrices below hold a slice of `rows` output channels starting at `base`:
  // channel o is row o - base of each of the 36 matrices.
  //
  // U[(p * rows + a - base) * B + b] = (G f_ab G^T)[p] for filters a in [a0, a1), where
  // f_ab = w[a][b] (A = o, B = c), or with `flipped` f_ab = w[b][a] turned by 180 degrees (A = c,
  // B = o: the input gradient's filter).
  void (*filter)(const float* w, int64_t a_count, int64_t b_count, bool flipped, int64_t base,
                 int64_t rows, int64_t a0, int64_t a1, float* u);
  // y tiles from M[(p * rows + o - base) * tbp + t]: AT m_t A (+ bias[o]), cropped to the image;
  // o in [o0, o1).
  void (*output)(const Shape& s, const float* m, const Tile* tiles, int64_t tb, int64_t tbp,
                 const float* bias, int64_t base, int64_t rows, int64_t o0, int64_t o1, float* y);
  // The weight gradient's transform of gy: GY[(p * rows + o - base) * tbp + t] =
  // (Gw e_t Gw^T)[p] for the 4x4 output-gradient tile e_t (zero outside the output); tiles
  // t >= tb are zero.
  void (*grad)(const Shape& s, const float* gy, const Tile* tiles, int64_t tb, int64_t tbp,
               int64_t base, int64_t rows, int64_t o0, int64_t o1, float* gyt);
  // gw[o][c] (3x3) = AWt S_oc AW from S[(p * rows + o - base) * C + c], for o in [o0, o1).
  void (*weight)(const Shape& s, const float* sum, int64_t base, int64_t rows, int64_t o0,
                 int64_t o1, float* gw);

  // The same transforms for channels-last data (x and y [n][h][w][c], filters [o][3][3][c]),
  // vectorized over eight channels instead of eight tiles. V as input() (one row of tiles per
  // channel; tiles t in [tb, tbp) zero) and y from M as output(), for the groups of eight tiles
  // [g0, g1), through 8x8 transposes; U as filter(), from w[a][3][3][b] or, `flipped`,
  // w[b][3][3][a]; the gradient's transform holds one row of channels per tile,
  // GY[(p * tb + t) * rows + o - base], for the tiles [t0, t1); gw[o][3][3][c] from S as weight().
  void (*input_cl)(const Shape& s, const float* x, const Tile* tiles, int64_t tb, int64_t tbp,
                   int64_t g0, int64_t g1, float* v);
  void (*filter_cl)(const float* w, int64_t a_count, int64_t b_count, bool flipped, int64_t base,
                    int64_t rows, int64_t a0, int64_t a1, float* u);
  void (*output_cl)(const Shape& s, const float* m, const Tile* tiles, int64_t tb, int64_t tbp,
                    const float* bias, int64_t base, int64_t rows, int64_t g0, int64_t g1,
                    float* y);
  void (*grad_cl)(const Shape& s, const float* gy, const Tile* tiles, int64_t tb, int64_t base,
                  int64_t rows, int64_t t0, int64_t t1, float* gyt);
  void (*weight_cl)(const Shape& s, const float* sum, int64_t base, int64_t rows, int64_t o0,
                    int64_t o1, float* gw);
};

// Floats of `pad` that input() needs: the padded planes of the images one block of `tb` tiles
// can touch.
inline int64_t input_scratch_floats(const Shape& s, int64_t tb) {
  const int64_t tile_rows = (s.ho + 3) / 4, tile_cols = (s.wo + 3) / 4;
  const int64_t images = (tb + tile_rows * tile_cols - 1) / (tile_rows * tile_cols) + 1;
  return images * (4 * tile_rows + 2) * (4 * tile_cols + 4);
}

// The table compiled for any x86-64 and the AVX2 + FMA one (null when not built).
const Kernels& generic_kernels();
const Kernels* avx2_kernels();

}  // namespace rg::kernels::cpu::winograd

#ifdef RG_WINOGRAD_ISA
#include <cstring>

#include "kernels/cpu/winograd_matrices.h"

// Eight-float vectors also in the generic build (two SSE registers each). GCC warns that such a
// return value's ABI depends on AVX; these helpers are always inlined within one translation
// unit, so no call crosses an ABI boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace rg::kernels::cpu::winograd::RG_WINOGRAD_ISA {

using v8 = float __attribute__((vector_size(32)));
using i8 = int __attribute__((vector_size(32)));

[[gnu::always_inline]] inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline void store8(float* p, v8 v) { std::memcpy(p, &v, sizeof v); }
[[gnu::always_inline]] inline v8 splat(float a) { return v8{a, a, a, a, a, a, a, a}; }
inline int64_t lesser(int64_t a, int64_t b) { return a < b ? a : b; }

// out (rows x cols) = K (rows x k) * in (k x cols), or with `right` in * K^T. K is constexpr, so
// after unrolling its zeros drop out and its ones become plain adds.
template <int Rows, int Inner, int Cols, const auto& K>
inline void left(const v8 (&in)[Inner][Cols], v8 (&out)[Rows][Cols]) {
#pragma GCC unroll 8
  for (int i = 0; i < Rows; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < Cols; ++j) {
      v8 acc = splat(0.0f);
#pragma GCC unroll 8
      for (int k = 0; k < Inner; ++k) {
        const float c = float(K[i * Inner + k]);
        if (c == 1.0f) {
          acc += in[k][j];
        } else if (c == -1.0f) {
          acc -= in[k][j];
        } else if (c != 0.0f) {
          acc += splat(c) * in[k][j];
        }
      }
      out[i][j] = acc;
    }
  }
}
template <int Rows, int Inner, int Cols, const auto& K>
inline void right(const v8 (&in)[Rows][Inner], v8 (&out)[Rows][Cols]) {
#pragma GCC unroll 8
  for (int i = 0; i < Rows; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < Cols; ++j) {
      v8 acc = splat(0.0f);
#pragma GCC unroll 8
      for (int k = 0; k < Inner; ++k) {
        const float c = float(K[j * Inner + k]);
        if (c == 1.0f) {
          acc += in[i][k];
        } else if (c == -1.0f) {
          acc -= in[i][k];
        } else if (c != 0.0f) {
          acc += splat(c) * in[i][k];
        }
      }
      out[i][j] = acc;
    }
  }
}

inline constexpr auto kBT = kF43.bt;   // 6 x 6
inline constexpr auto kAT = kF43.at;   // 4 x 6
inline constexpr auto kG = kF43.g;     // 6 x 3
inline constexpr auto kGw = kF34.g;    // 6 x 4
inline constexpr auto kAWt = kF34.at;  // 3 x 6

// The 8x8 transpose of rows r[0..7]: r[l] becomes column l (GCC turns the shuffles into
// unpck/shufps/vperm2f128 with AVX, pairs of SSE shuffles without).
[[gnu::always_inline]] inline void transpose8(v8 (&r)[8]) {
  v8 t[8], u[8];
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = __builtin_shuffle(r[2 * k], r[2 * k + 1], i8{0, 8, 1, 9, 4, 12, 5, 13});
    t[2 * k + 1] = __builtin_shuffle(r[2 * k], r[2 * k + 1], i8{2, 10, 3, 11, 6, 14, 7, 15});
  }
  for (int k = 0; k < 2; ++k) {
    for (int h = 0; h < 2; ++h) {
      const v8 a = t[4 * k + h], b = t[4 * k + h + 2];
      u[4 * k + 2 * h] = __builtin_shuffle(a, b, i8{0, 1, 8, 9, 4, 5, 12, 13});
      u[4 * k + 2 * h + 1] = __builtin_shuffle(a, b, i8{2, 3, 10, 11, 6, 7, 14, 15});
    }
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = __builtin_shuffle(u[j], u[j + 4], i8{0, 1, 2, 3, 8, 9, 10, 11});
    r[j + 4] = __builtin_shuffle(u[j], u[j + 4], i8{4, 5, 6, 7, 12, 13, 14, 15});
  }
}

inline void input(const Shape& s, const float* x, const Tile* tiles, int64_t tb, int64_t tbp,
                  int64_t c0, int64_t c1, float* v, float* pad) {
  // Per channel, the block's images are first copied into zero-padded planes (the padding, and
  // room for 8-float loads past a tile's 6 columns), so that every tile row is one unconditional
  // load; eight of those (one per tile) are transposed into the 6 columns of the patches.
  const int64_t tile_rows = (s.ho + 3) / 4, tile_cols = (s.wo + 3) / 4;
  const int64_t hp = 4 * tile_rows + 2, wp = 4 * tile_cols + 4;
  const int64_t first = tiles[0].image, images = tiles[tb - 1].image - first + 1;
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t i = 0; i < images; ++i) {
      const float* plane = x + ((first + i) * s.c + c) * s.h * s.w;
      float* dst = pad + i * hp * wp;
      for (int64_t yy = 0; yy < hp; ++yy) {
        float* row = dst + yy * wp;
        const int64_t sy = yy - s.ph;
        if (sy < 0 || sy >= s.h) {
          __builtin_memset(row, 0, size_t(wp) * sizeof(float));
          continue;
        }
        const int64_t lead = s.pw < wp ? s.pw : wp;
        const int64_t span = lesser(s.w, wp - lead);
        __builtin_memset(row, 0, size_t(lead) * sizeof(float));
        __builtin_memcpy(row + lead, plane + sy * s.w, size_t(span) * sizeof(float));
        __builtin_memset(row + lead + span, 0, size_t(wp - lead - span) * sizeof(float));
      }
    }
    for (int64_t t0 = 0; t0 < tbp; t0 += 8) {
      const float* origin[8];
      for (int l = 0; l < 8; ++l) {
        const Tile& t = tiles[t0 + l < tb ? t0 + l : t0];
        origin[l] = pad + (t.image - first) * hp * wp + t.oy * wp + t.ox;
      }
      v8 d[6][6];
      for (int i = 0; i < 6; ++i) {
        v8 r[8];
        for (int l = 0; l < 8; ++l) r[l] = t0 + l < tb ? load8(origin[l] + i * wp) : splat(0.0f);
        transpose8(r);
        for (int j = 0; j < 6; ++j) d[i][j] = r[j];
      }
      v8 t[6][6], r[6][6];
      left<6, 6, 6, kBT>(d, t);
      right<6, 6, 6, kBT>(t, r);
      float* dst = v + c * tbp + t0;
      const int64_t stride = s.c * tbp;
#pragma GCC unroll 36
      for (int p = 0; p < 36; ++p) store8(dst + p * stride, r[p / 6][p % 6]);
    }
  }
}

inline void filter(const float* w, int64_t a_count, int64_t b_count, bool flipped, int64_t base,
                   int64_t rows, int64_t a0, int64_t a1, float* u) {
  // Eight filters b at a time (a remainder is padded with zero filters and not stored).
  for (int64_t a = a0; a < a1; ++a) {
    for (int64_t b0 = 0; b0 < b_count; b0 += 8) {
      const int lanes = int(lesser(8, b_count - b0));
      v8 f[3][3];
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) f[i][j] = splat(0.0f);
      }
      for (int l = 0; l < lanes; ++l) {
        const int64_t b = b0 + l;
        const float* k = flipped ? w + (b * a_count + a) * 9 : w + (a * b_count + b) * 9;
        for (int i = 0; i < 3; ++i) {
          for (int j = 0; j < 3; ++j) f[i][j][l] = flipped ? k[8 - (i * 3 + j)] : k[i * 3 + j];
        }
      }
      v8 t[6][3], r[6][6];
      left<6, 3, 3, kG>(f, t);
      right<6, 3, 6, kG>(t, r);
      for (int p = 0; p < 36; ++p) {
        float* dst = u + (p * rows + a - base) * b_count + b0;
        if (lanes == 8) {
          store8(dst, r[p / 6][p % 6]);
        } else {
          for (int l = 0; l < lanes; ++l) dst[l] = r[p / 6][p % 6][l];
        }
      }
    }
  }
}

// r = AT m A for eight tiles' transformed outputs m[p] at src + p * stride.
[[gnu::always_inline]] inline void output_tiles(const float* src, int64_t stride, v8 (&r)[4][4]) {
  v8 in[6][6];
#pragma GCC unroll 36
  for (int p = 0; p < 36; ++p) in[p / 6][p % 6] = load8(src + p * stride);
  v8 t[4][6];
  left<4, 6, 6, kAT>(in, t);
  right<4, 6, 4, kAT>(t, r);
}

inline void output(const Shape& s, const float* m, const Tile* tiles, int64_t tb, int64_t tbp,
                   const float* bias, int64_t base, int64_t rows, int64_t o0, int64_t o1,
                   float* y) {
  for (int64_t o = o0; o < o1; ++o) {
    const float b = bias ? bias[o] : 0.0f;
    for (int64_t t0 = 0; t0 < tb; t0 += 8) {
      v8 r[4][4];
      output_tiles(m + (o - base) * tbp + t0, rows * tbp, r);
      // Row i of every tile: the 4 vectors r[i][0..3] regrouped so that q[l % 4] holds tile l's
      // 4 values in its low (l < 4) or high half.
      float rows4[4][4][8];
      for (int i = 0; i < 4; ++i) {
        const v8 q[4] = {r[i][0] + splat(b), r[i][1] + splat(b), r[i][2] + splat(b),
                         r[i][3] + splat(b)};
        const v8 t[4] = {__builtin_shuffle(q[0], q[1], i8{0, 8, 1, 9, 4, 12, 5, 13}),
                         __builtin_shuffle(q[0], q[1], i8{2, 10, 3, 11, 6, 14, 7, 15}),
                         __builtin_shuffle(q[2], q[3], i8{0, 8, 1, 9, 4, 12, 5, 13}),
                         __builtin_shuffle(q[2], q[3], i8{2, 10, 3, 11, 6, 14, 7, 15})};
        store8(rows4[i][0], __builtin_shuffle(t[0], t[2], i8{0, 1, 8, 9, 4, 5, 12, 13}));
        store8(rows4[i][1], __builtin_shuffle(t[0], t[2], i8{2, 3, 10, 11, 6, 7, 14, 15}));
        store8(rows4[i][2], __builtin_shuffle(t[1], t[3], i8{0, 1, 8, 9, 4, 5, 12, 13}));
        store8(rows4[i][3], __builtin_shuffle(t[1], t[3], i8{2, 3, 10, 11, 6, 7, 14, 15}));
      }
      for (int l = 0; l < 8 && t0 + l < tb; ++l) {
        const Tile& tile = tiles[t0 + l];
        float* plane = y + (tile.image * s.o + o) * s.ho * s.wo;
        const int rows = int(lesser(4, s.ho - tile.oy)), cols = int(lesser(4, s.wo - tile.ox));
        for (int i = 0; i < rows; ++i) {
          float* row = plane + (tile.oy + i) * s.wo + tile.ox;
          const float* src = rows4[i][l % 4] + 4 * (l / 4);
          if (cols == 4) {
            __builtin_memcpy(row, src, 4 * sizeof(float));
          } else {
            for (int j = 0; j < cols; ++j) row[j] = src[j];
          }
        }
      }
    }
  }
}

inline void grad(const Shape& s, const float* gy, const Tile* tiles, int64_t tb, int64_t tbp,
                 int64_t base, int64_t rows, int64_t o0, int64_t o1, float* gyt) {
  for (int64_t o = o0; o < o1; ++o) {
    for (int64_t t0 = 0; t0 < tbp; t0 += 8) {
      v8 e[4][4];
      for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 4; ++j) e[i][j] = splat(0.0f);
      }
      for (int l = 0; l < 8 && t0 + l < tb; ++l) {
        const Tile& tile = tiles[t0 + l];
        const float* plane = gy + (tile.image * s.o + o) * s.ho * s.wo;
        const int rows = int(lesser(4, s.ho - tile.oy)), cols = int(lesser(4, s.wo - tile.ox));
        for (int i = 0; i < rows; ++i) {
          const float* row = plane + (tile.oy + i) * s.wo + tile.ox;
          for (int j = 0; j < cols; ++j) e[i][j][l] = row[j];
        }
      }
      v8 t[6][4], r[6][6];
      left<6, 4, 4, kGw>(e, t);
      right<6, 4, 6, kGw>(t, r);
      float* dst = gyt + (o - base) * tbp + t0;
      const int64_t stride = rows * tbp;
#pragma GCC unroll 36
      for (int p = 0; p < 36; ++p) store8(dst + p * stride, r[p / 6][p % 6]);
    }
  }
}

// Eight consecutive floats, of which `lanes` (< 8 only for the last few channels) are read or
// written.
[[gnu::always_inline]] inline v8 load_n(const float* p, int lanes) {
  if (lanes == 8) return load8(p);
  v8 v = splat(0.0f);
  for (int l = 0; l < lanes; ++l) v[l] = p[l];
  return v;
}
[[gnu::always_inline]] inline void store_n(float* p, v8 v, int lanes) {
  if (lanes == 8) {
    store8(p, v);
    return;
  }
  for (int l = 0; l < lanes; ++l) p[l] = v[l];
}

// gw from S, [o][c][3][3] or channels-last [o][3][3][c].
template <bool ChannelsLast>
inline void weight_in(const Shape& s, const float* sum, int64_t base, int64_t rows, int64_t o0,
                      int64_t o1, float* gw) {
  for (int64_t o = o0; o < o1; ++o) {
    for (int64_t c0 = 0; c0 < s.c; c0 += 8) {
      const int lanes = int(lesser(8, s.c - c0));
      v8 in[6][6];
      for (int p = 0; p < 36; ++p) {
        in[p / 6][p % 6] = load_n(sum + (p * rows + o - base) * s.c + c0, lanes);
      }
      v8 t[3][6], r[3][3];
      left<3, 6, 6, kAWt>(in, t);
      right<3, 6, 3, kAWt>(t, r);
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
          if constexpr (ChannelsLast) {
            store_n(gw + (o * 9 + i * 3 + j) * s.c + c0, r[i][j], lanes);
          } else {
            for (int l = 0; l < lanes; ++l) gw[(o * s.c + c0 + l) * 9 + i * 3 + j] = r[i][j][l];
          }
        }
      }
    }
  }
}
inline void weight(const Shape& s, const float* sum, int64_t base, int64_t rows, int64_t o0,
                   int64_t o1, float* gw) {
  weight_in<false>(s, sum, base, rows, o0, o1, gw);
}
inline void weight_cl(const Shape& s, const float* sum, int64_t base, int64_t rows, int64_t o0,
                      int64_t o1, float* gw) {
  weight_in<true>(s, sum, base, rows, o0, o1, gw);
}

inline void input_cl(const Shape& s, const float* x, const Tile* tiles, int64_t tb, int64_t tbp,
                     int64_t g0, int64_t g1, float* v) {
  // Eight channels of eight tiles at a time: each tile's transform over the eight channels, then
  // per point an 8x8 transpose to the channels' rows of tiles (as output_cl, the other way).
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t t0 = 8 * g;
    for (int64_t c0 = 0; c0 < s.c; c0 += 8) {
      const int lanes = int(lesser(8, s.c - c0));
      v8 res[36][8];
      for (int l = 0; l < 8; ++l) {
        if (t0 + l >= tb) {
          for (int p = 0; p < 36; ++p) res[p][l] = splat(0.0f);
          continue;
        }
        const Tile& tile = tiles[t0 + l];
        const int64_t y0 = tile.oy - s.ph, x0 = tile.ox - s.pw;
        const float* image = x + tile.image * s.h * s.w * s.c;
        v8 d[6][6];
        for (int i = 0; i < 6; ++i) {
          const bool row_in = y0 + i >= 0 && y0 + i < s.h;
          for (int j = 0; j < 6; ++j) {
            d[i][j] = row_in && x0 + j >= 0 && x0 + j < s.w
                          ? load_n(image + ((y0 + i) * s.w + x0 + j) * s.c + c0, lanes)
                          : splat(0.0f);
          }
        }
        v8 t[6][6], r[6][6];
        left<6, 6, 6, kBT>(d, t);
        right<6, 6, 6, kBT>(t, r);
        for (int p = 0; p < 36; ++p) res[p][l] = r[p / 6][p % 6];
      }
      for (int p = 0; p < 36; ++p) {
        transpose8(res[p]);
        for (int k = 0; k < lanes; ++k) store8(v + (p * s.c + c0 + k) * tbp + t0, res[p][k]);
      }
    }
  }
}

// The filters (a, b0 .. b0 + lanes) one at a time, eight b per vector.
[[gnu::always_inline]] inline void filter_cl_lanes(const float* w, int64_t a_count, int64_t b_count,
                                                   bool flipped, int64_t base, int64_t rows,
                                                   int64_t a, int64_t b0, int lanes, float* u) {
  v8 f[3][3];
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      if (!flipped) {
        f[i][j] = load_n(w + (a * 9 + i * 3 + j) * b_count + b0, lanes);
        continue;
      }
      f[i][j] = splat(0.0f);
      for (int l = 0; l < lanes; ++l) {
        f[i][j][l] = w[((b0 + l) * 9 + 8 - (i * 3 + j)) * a_count + a];
      }
    }
  }
  v8 t[6][3], r[6][6];
  left<6, 3, 3, kG>(f, t);
  right<6, 3, 6, kG>(t, r);
  for (int p = 0; p < 36; ++p) {
    store_n(u + (p * rows + a - base) * b_count + b0, r[p / 6][p % 6], lanes);
  }
}

inline void filter_cl(const float* w, int64_t a_count, int64_t b_count, bool flipped, int64_t base,
                      int64_t rows, int64_t a0, int64_t a1, float* u) {
  // Flipped, w[b][tap][a] is contiguous in a, and its rows are a_count floats apart, a power of
  // two in most models, so that gathering eight b per vector makes every load miss the caches.
  // Instead eight a per vector, in blocks of 8 a by 16 b: each b's transform, then per point
  // two 8x8 transposes to whole cache lines of 16 b. The rest goes one filter row at a time.
  const int64_t a_end = a0 + (a1 - a0) / 8 * 8, b_end = flipped ? b_count / 16 * 16 : 0;
  for (int64_t b0 = 0; b0 < b_end; b0 += 16) {
    for (int64_t a = a0; a < a_end; a += 8) {
      v8 res[2][36][8];
      for (int l = 0; l < 16; ++l) {
        v8 f[3][3];
        for (int i = 0; i < 3; ++i) {
          for (int j = 0; j < 3; ++j) {
            f[i][j] = load8(w + ((b0 + l) * 9 + 8 - (i * 3 + j)) * a_count + a);
          }
        }
        v8 t[6][3], r[6][6];
        left<6, 3, 3, kG>(f, t);
        right<6, 3, 6, kG>(t, r);
        for (int p = 0; p < 36; ++p) res[l / 8][p][l % 8] = r[p / 6][p % 6];
      }
      for (int p = 0; p < 36; ++p) {
        transpose8(res[0][p]);
        transpose8(res[1][p]);
        for (int k = 0; k < 8; ++k) {
          float* dst = u + (p * rows + a + k - base) * b_count + b0;
          store8(dst, res[0][p][k]);
          store8(dst + 8, res[1][p][k]);
        }
      }
    }
  }
  for (int64_t a = a0; a < a1; ++a) {
    for (int64_t b0 = a < a_end ? b_end : 0; b0 < b_count; b0 += 8) {
      filter_cl_lanes(w, a_count, b_count, flipped, base, rows, a, b0, int(lesser(8, b_count - b0)),
                      u);
    }
  }
}

inline void output_cl(const Shape& s, const float* m, const Tile* tiles, int64_t tb, int64_t tbp,
                      const float* bias, int64_t base, int64_t rows, int64_t g0, int64_t g1,
                      float* y) {
  // Eight channels of eight tiles at a time: each channel's transform over the eight tiles (as
  // output()), then per output position an 8x8 transpose to the tiles' rows of channels.
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t t0 = 8 * g;
    for (int64_t c0 = 0; c0 < rows; c0 += 8) {
      const int lanes = int(lesser(8, rows - c0));
      v8 out[16][8];
      for (int l = 0; l < 8; ++l) {
        if (l >= lanes) {
          for (int q = 0; q < 16; ++q) out[q][l] = splat(0.0f);
          continue;
        }
        v8 r[4][4];
        output_tiles(m + (c0 + l) * tbp + t0, rows * tbp, r);
        for (int q = 0; q < 16; ++q) out[q][l] = r[q / 4][q % 4];
      }
      for (int q = 0; q < 16; ++q) transpose8(out[q]);
      const v8 b = bias ? load_n(bias + base + c0, lanes) : splat(0.0f);
      for (int l = 0; l < 8 && t0 + l < tb; ++l) {
        const Tile& tile = tiles[t0 + l];
        const int height = int(lesser(4, s.ho - tile.oy)), width = int(lesser(4, s.wo - tile.ox));
        float* image = y + tile.image * s.ho * s.wo * s.o;
        for (int i = 0; i < height; ++i) {
          float* row = image + ((tile.oy + i) * s.wo + tile.ox) * s.o + base + c0;
          for (int j = 0; j < width; ++j) store_n(row + j * s.o, out[i * 4 + j][l] + b, lanes);
        }
      }
    }
  }
}

inline void grad_cl(const Shape& s, const float* gy, const Tile* tiles, int64_t tb, int64_t base,
                    int64_t rows, int64_t t0, int64_t t1, float* gyt) {
  for (int64_t k = t0; k < t1; ++k) {
    const Tile& tile = tiles[k];
    const int height = int(lesser(4, s.ho - tile.oy)), width = int(lesser(4, s.wo - tile.ox));
    const float* image = gy + tile.image * s.ho * s.wo * s.o;
    for (int64_t c0 = 0; c0 < rows; c0 += 8) {
      const int lanes = int(lesser(8, rows - c0));
      v8 e[4][4];
      for (int i = 0; i < 4; ++i) {
        const float* row = image + ((tile.oy + i) * s.wo + tile.ox) * s.o + base + c0;
        for (int j = 0; j < 4; ++j) {
          e[i][j] = i < height && j < width ? load_n(row + j * s.o, lanes) : splat(0.0f);
        }
      }
      v8 t[6][4], r[6][6];
      left<6, 4, 4, kGw>(e, t);
      right<6, 4, 6, kGw>(t, r);
      float* dst = gyt + k * rows + c0;
      const int64_t stride = tb * rows;
#pragma GCC unroll 36
      for (int p = 0; p < 36; ++p) store_n(dst + p * stride, r[p / 6][p % 6], lanes);
    }
  }
}

inline constexpr Kernels kTable{&input,    &filter,    &output,    &grad,    &weight,
                                &input_cl, &filter_cl, &output_cl, &grad_cl, &weight_cl};

}  // namespace rg::kernels::cpu::winograd::RG_WINOGRAD_ISA
#endif
