// f32 <-> f16 conversions with the F16C instructions, eight values at a time (built with -mf16c
// -mavx, called by cast.cpp only when the CPU has F16C). Round to nearest even, as float_to_half;
// NaNs stay NaNs (their payload bits may differ from float_to_half's canonical quiet NaN).
#include <immintrin.h>

#include <cstdint>

#include "kernels/half.h"

namespace rg::kernels::cpu {

void float_to_half_f16c(const float* src, Half* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

void half_to_float_f16c(const Half* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

}  // namespace rg::kernels::cpu
