// __half and __nv_bfloat16 under emulation: the layout and the conversion/arithmetic API of
// cuda_fp16.h and cuda_bf16.h, rounding to nearest even with the conversions of kernels/half.h.
#pragma once

#include <type_traits>

#include "kernels/emu/builtins.h"
#include "kernels/half.h"

// Both types keep their bits in `__x` like CUDA's, are trivially copyable and 2 bytes, so that
// buffers of rg::Half / rg::BFloat16 can be passed to kernels as __half* / __nv_bfloat16*.
// Conversions are implicit in both directions, as in CUDA; arithmetic rounds the float result.
struct __half {
  unsigned short __x;
  __half() = default;
  __half(float f) : __x(rg::float_to_half(f).bits) {}
  // Through float: for double this can round twice, unlike CUDA; kernels convert from float.
  __half(double d) : __half(static_cast<float>(d)) {}
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  __half(I i) : __half(static_cast<float>(i)) {}
  operator float() const { return rg::half_to_float(rg::Half{__x}); }
};

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(rg::float_to_bfloat16(f).bits) {}
  __nv_bfloat16(double d) : __nv_bfloat16(static_cast<float>(d)) {}
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  __nv_bfloat16(I i) : __nv_bfloat16(static_cast<float>(i)) {}
  operator float() const { return rg::bfloat16_to_float(rg::BFloat16{__x}); }
};

struct alignas(4) __half2 {
  __half x, y;
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

static_assert(sizeof(__half) == 2 && sizeof(__nv_bfloat16) == 2);

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) {
  __half h;
  h.__x = u;
  return h;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return static_cast<float>(b); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  __nv_bfloat16 b;
  b.__x = u;
  return b;
}

inline __half2 __floats2half2_rn(float a, float b) { return __half2{__half(a), __half(b)}; }
inline __half2 __float2half2_rn(float a) { return __half2{__half(a), __half(a)}; }
inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline float2 __half22float2(__half2 h) { return float2{float(h.x), float(h.y)}; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(b)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{float(h.x), float(h.y)}; }

// Arithmetic and comparisons of cuda_fp16.hpp / cuda_bf16.hpp (operands of the same type).
#define RG_EMU_HALF_OPS(H)                                                                   \
  inline H operator+(const H& a, const H& b) { return H(float(a) + float(b)); }              \
  inline H operator-(const H& a, const H& b) { return H(float(a) - float(b)); }              \
  inline H operator*(const H& a, const H& b) { return H(float(a) * float(b)); }              \
  inline H operator/(const H& a, const H& b) { return H(float(a) / float(b)); }              \
  inline H operator-(const H& a) { return H(-float(a)); }                                    \
  inline H operator+(const H& a) { return a; }                                               \
  inline H& operator+=(H& a, const H& b) { return a = a + b; }                               \
  inline H& operator-=(H& a, const H& b) { return a = a - b; }                               \
  inline H& operator*=(H& a, const H& b) { return a = a * b; }                               \
  inline H& operator/=(H& a, const H& b) { return a = a / b; }                               \
  inline bool operator==(const H& a, const H& b) { return float(a) == float(b); }            \
  inline bool operator!=(const H& a, const H& b) { return float(a) != float(b); }            \
  inline bool operator<(const H& a, const H& b) { return float(a) < float(b); }              \
  inline bool operator>(const H& a, const H& b) { return float(a) > float(b); }              \
  inline bool operator<=(const H& a, const H& b) { return float(a) <= float(b); }            \
  inline bool operator>=(const H& a, const H& b) { return float(a) >= float(b); }            \
  inline H __hadd(H a, H b) { return a + b; }                                                \
  inline H __hsub(H a, H b) { return a - b; }                                                \
  inline H __hmul(H a, H b) { return a * b; }                                                \
  inline H __hdiv(H a, H b) { return a / b; }                                                \
  inline H __hneg(H a) { return -a; }                                                        \
  inline H __hfma(H a, H b, H c) { return H(float(a) * float(b) + float(c)); }               \
  inline H __hmax(H a, H b) { return float(a) >= float(b) || float(b) != float(b) ? a : b; } \
  inline H __hmin(H a, H b) { return float(a) <= float(b) || float(b) != float(b) ? a : b; } \
  inline bool __heq(H a, H b) { return a == b; }                                             \
  inline bool __hlt(H a, H b) { return a < b; }                                              \
  inline bool __hgt(H a, H b) { return a > b; }                                              \
  inline bool __hisnan(H a) { return float(a) != float(a); }

RG_EMU_HALF_OPS(__half)
RG_EMU_HALF_OPS(__nv_bfloat16)
#undef RG_EMU_HALF_OPS
