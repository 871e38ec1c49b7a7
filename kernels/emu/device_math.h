// The CUDA device math API under emulation: the C library functions (expf, logf, erff, ...) come
// from <math.h>; this adds CUDA's own (rsqrtf, __expf, __fdividef, __float_as_int, min/max, ...).
#pragma once

#include <math.h>

#include <bit>
#include <cmath>
#include <cstdint>

// The fast intrinsics (__expf, __fdividef, ...) are exact here, so an emulated result can be more
// accurate than the GPU's: tests compare with tolerances anyway.

// glibc declares these with C linkage (its internal aliases) but does not define them; the
// declarations fix the signature, so define them with C linkage too.
extern "C" {
inline float __expf(float x) noexcept { return ::expf(x); }
inline float __exp10f(float x) noexcept { return ::exp10f(x); }
inline float __logf(float x) noexcept { return ::logf(x); }
inline float __log2f(float x) noexcept { return ::log2f(x); }
inline float __log10f(float x) noexcept { return ::log10f(x); }
inline float __powf(float x, float y) noexcept { return ::powf(x, y); }
inline float __sinf(float x) noexcept { return ::sinf(x); }
inline float __cosf(float x) noexcept { return ::cosf(x); }
inline float __tanf(float x) noexcept { return ::tanf(x); }
inline void __sincosf(float x, float* s, float* c) noexcept { ::sincosf(x, s, c); }
}

inline float rsqrtf(float x) { return 1.0f / ::sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / ::cbrtf(x); }
inline float normcdff(float x) { return 0.5f * ::erfcf(-x * 0.70710678118654752f); }
inline double normcdf(double x) { return 0.5 * std::erfc(-x * 0.70710678118654752); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }

// Explicitly rounded operations: kernels use them to keep the compiler from contracting into FMA.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return ::sqrtf(a); }
inline float __frsqrt_rn(float a) { return 1.0f / ::sqrtf(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }

inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline int __float2int_rd(float x) { return static_cast<int>(std::floor(x)); }
inline int __float2int_ru(float x) { return static_cast<int>(std::ceil(x)); }
inline unsigned int __float2uint_rn(float x) {
  return static_cast<unsigned int>(std::nearbyint(x));
}
inline long long __float2ll_rn(float x) { return static_cast<long long>(std::nearbyint(x)); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline float __uint2float_rn(unsigned int x) { return static_cast<float>(x); }
inline float __ll2float_rn(long long x) { return static_cast<float>(x); }
inline int __double2int_rn(double x) { return static_cast<int>(std::nearbyint(x)); }
inline float __double2float_rn(double x) { return static_cast<float>(x); }

inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline unsigned int __float_as_uint(float x) { return std::bit_cast<unsigned int>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline float __uint_as_float(unsigned int x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }

inline int __popc(unsigned int x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned int>(x)); }
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned int>(x)) + 1; }
inline int __ffsll(long long x) {
  return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1;
}
inline unsigned int __brev(unsigned int x) {
  unsigned int r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline int __mul24(int a, int b) { return (a << 8 >> 8) * (b << 8 >> 8); }
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
  return static_cast<unsigned int>((static_cast<uint64_t>(a) * b) >> 32);
}
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<int64_t>(a) * b) >> 32); }

// CUDA declares min/max for the arithmetic types in the global namespace of device code.
#define RG_EMU_MIN_MAX(T)                          \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
RG_EMU_MIN_MAX(int)
RG_EMU_MIN_MAX(unsigned int)
RG_EMU_MIN_MAX(long)
RG_EMU_MIN_MAX(unsigned long)
RG_EMU_MIN_MAX(long long)
RG_EMU_MIN_MAX(unsigned long long)
#undef RG_EMU_MIN_MAX
// Mixed signedness compares as unsigned, like CUDA's overloads.
#define RG_EMU_MIN_MAX_MIXED(S, U)                             \
  inline U min(S a, U b) { return min(static_cast<U>(a), b); } \
  inline U min(U a, S b) { return min(a, static_cast<U>(b)); } \
  inline U max(S a, U b) { return max(static_cast<U>(a), b); } \
  inline U max(U a, S b) { return max(a, static_cast<U>(b)); }
RG_EMU_MIN_MAX_MIXED(int, unsigned int)
RG_EMU_MIN_MAX_MIXED(long, unsigned long)
RG_EMU_MIN_MAX_MIXED(long long, unsigned long long)
#undef RG_EMU_MIN_MAX_MIXED
inline float min(float a, float b) { return ::fminf(a, b); }
inline float max(float a, float b) { return ::fmaxf(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline double min(float a, double b) { return std::fmin(a, b); }
inline double max(float a, double b) { return std::fmax(a, b); }
inline double min(double a, float b) { return std::fmin(a, b); }
inline double max(double a, float b) { return std::fmax(a, b); }
