// Bit-exact f16 and bf16 storage types with round-to-nearest-even conversions from f32.
// Header-only and constexpr-friendly so host code, CPU kernels and emulated CUDA share them.
#pragma once

#include <bit>
#include <cstdint>

namespace rg {

struct Half {
  uint16_t bits = 0;
};
struct BFloat16 {
  uint16_t bits = 0;
};

inline float half_to_float(Half h) {
  const uint32_t sign = (uint32_t(h.bits) & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1f;
  uint32_t man = h.bits & 0x3ffu;
  uint32_t out;
  if (exp == 0x1f) {
    out = sign | 0x7f800000u | (man << 13);  // inf / nan
  } else if (exp == 0) {
    if (man == 0) {
      out = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      out = sign | (uint32_t(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else {
    out = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return std::bit_cast<float>(out);
}

inline Half float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan (keep nan quiet)
    return Half{uint16_t(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u))};
  }
  if (abs >= 0x477ff000u) return Half{uint16_t(sign | 0x7c00u)};  // rounds to inf
  if (abs < 0x38800000u) {                                          // subnormal or zero in f16
    if (abs < 0x33000000u) return Half{sign};                       // below half the smallest
    const uint32_t exp = abs >> 23;
    const uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (113 - exp) - 1 ... so that result is man >> (shift)
    uint32_t res = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (res & 1u))) ++res;
    return Half{uint16_t(sign | res)};
  }
  uint32_t res = ((abs >> 13) - (112u << 10));  // rebias exponent 127 -> 15
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (res & 1u))) ++res;
  return Half{uint16_t(sign | res)};
}

inline float bfloat16_to_float(BFloat16 b) {
  return std::bit_cast<float>(uint32_t(b.bits) << 16);
}

inline BFloat16 float_to_bfloat16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return BFloat16{uint16_t((x >> 16) | 0x40u)};  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return BFloat16{uint16_t(x >> 16)};
}

}  // namespace rg
