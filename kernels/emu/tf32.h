// TF32 as the emulated cuBLAS and cuDNN compute it: each input of a product rounded to a 10-bit
// mantissa before the f32 arithmetic, so that tests see TF32's error where a real GPU would.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace rg::emu {

// Round to nearest, ties away from zero, to 10 mantissa bits (PTX cvt.rna.tf32.f32, the
// conversion the tensor cores' f32 paths use). Infinities and NaNs pass unchanged; a value that
// rounds past the largest finite TF32 becomes an infinity, as in hardware.
inline float round_to_tf32(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t bits = std::bit_cast<uint32_t>(x);
  bits += 0x1000u;  // half of the lowest kept bit (bit 13)
  bits &= ~0x1fffu;
  return std::bit_cast<float>(bits);
}

inline void round_to_tf32(float* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = round_to_tf32(p[i]);
}

// NVIDIA_TF32_OVERRIDE=0 turns TF32 off in cuBLAS and cuDNN whatever the caller asked for.
inline bool tf32_overridden_off() {
  const char* v = std::getenv("NVIDIA_TF32_OVERRIDE");
  return v != nullptr && std::strcmp(v, "0") == 0;
}

}  // namespace rg::emu
