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
  void (*input)(const Shape& s, const float* x, const Tile* tiles, int64_t tb, int64_t tbp,
                int64_t c0, int64_t c1, float* v);
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
};

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

inline void input(const Shape& s, const float* x, const Tile* tiles, int64_t tb, int64_t tbp,
                  int64_t c0, int64_t c1, float* v) {
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t t0 = 0; t0 < tbp; t0 += 8) {
      v8 d[6][6];
      for (int i = 0; i < 6; ++i) {
        for (int j = 0; j < 6; ++j) d[i][j] = splat(0.0f);
      }
      for (int l = 0; l < 8 && t0 + l < tb; ++l) {
        const Tile& t = tiles[t0 + l];
        const float* plane = x + (t.image * s.c + c) * s.h * s.w;
        const int64_t y0 = t.oy - s.ph, x0 = t.ox - s.pw;
        if (y0 >= 0 && x0 >= 0 && y0 + 6 <= s.h && x0 + 6 <= s.w) {
          for (int i = 0; i < 6; ++i) {
            const float* row = plane + (y0 + i) * s.w + x0;
            for (int j = 0; j < 6; ++j) d[i][j][l] = row[j];
          }
        } else {
          for (int i = 0; i < 6; ++i) {
            const int64_t yy = y0 + i;
            if (yy < 0 || yy >= s.h) continue;
            const float* row = plane + yy * s.w;
            for (int j = 0; j < 6; ++j) {
              const int64_t xx = x0 + j;
              if (xx >= 0 && xx < s.w) d[i][j][l] = row[xx];
            }
          }
        }
      }
      v8 t[6][6], r[6][6];
      left<6, 6, 6, kBT>(d, t);
      right<6, 6, 6, kBT>(t, r);
      for (int p = 0; p < 36; ++p) store8(v + (p * s.c + c) * tbp + t0, r[p / 6][p % 6]);
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

inline void output(const Shape& s, const float* m, const Tile* tiles, int64_t tb, int64_t tbp,
                   const float* bias, int64_t base, int64_t rows, int64_t o0, int64_t o1,
                   float* y) {
  for (int64_t o = o0; o < o1; ++o) {
    const float b = bias ? bias[o] : 0.0f;
    for (int64_t t0 = 0; t0 < tb; t0 += 8) {
      v8 in[6][6];
      for (int p = 0; p < 36; ++p) in[p / 6][p % 6] = load8(m + (p * rows + o - base) * tbp + t0);
      v8 t[4][6], r[4][4];
      left<4, 6, 6, kAT>(in, t);
      right<4, 6, 4, kAT>(t, r);
      for (int l = 0; l < 8 && t0 + l < tb; ++l) {
        const Tile& tile = tiles[t0 + l];
        float* plane = y + (tile.image * s.o + o) * s.ho * s.wo;
        const int rows = int(lesser(4, s.ho - tile.oy)), cols = int(lesser(4, s.wo - tile.ox));
        for (int i = 0; i < rows; ++i) {
          float* row = plane + (tile.oy + i) * s.wo + tile.ox;
          for (int j = 0; j < cols; ++j) row[j] = r[i][j][l] + b;
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
      for (int p = 0; p < 36; ++p) store8(gyt + (p * rows + o - base) * tbp + t0, r[p / 6][p % 6]);
    }
  }
}

inline void weight(const Shape& s, const float* sum, int64_t base, int64_t rows, int64_t o0,
                   int64_t o1, float* gw) {
  for (int64_t o = o0; o < o1; ++o) {
    for (int64_t c0 = 0; c0 < s.c; c0 += 8) {
      const int lanes = int(lesser(8, s.c - c0));
      v8 in[6][6];
      for (int p = 0; p < 36; ++p) {
        const float* src = sum + (p * rows + o - base) * s.c + c0;
        if (lanes == 8) {
          in[p / 6][p % 6] = load8(src);
        } else {
          in[p / 6][p % 6] = splat(0.0f);
          for (int l = 0; l < lanes; ++l) in[p / 6][p % 6][l] = src[l];
        }
      }
      v8 t[3][6], r[3][3];
      left<3, 6, 6, kAWt>(in, t);
      right<3, 6, 3, kAWt>(t, r);
      for (int l = 0; l < lanes; ++l) {
        float* k = gw + (o * s.c + c0 + l) * 9;
        for (int i = 0; i < 3; ++i) {
          for (int j = 0; j < 3; ++j) k[i * 3 + j] = r[i][j][l];
        }
      }
    }
  }
}

inline constexpr Kernels kTable{&input, &filter, &output, &grad, &weight};

}  // namespace rg::kernels::cpu::winograd::RG_WINOGRAD_ISA
#endif
