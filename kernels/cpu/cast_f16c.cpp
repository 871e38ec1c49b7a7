// f32 <-> f16 conversions with the F16C instructions, eight values at a time (built with -mf16c
// -mavx, called by cast.cpp only when the CPU has F16C). Round to nearest even, as float_to_half.
// Eight values holding a NaN go through the scalar conversions instead, so NaN bit patterns are
// exactly the scalar ones (F16C keeps a NaN's payload bits and quiets signalling NaNs; we
// canonicalize, as CUDA does).
#include <immintrin.h>

#include <cstdint>

#include "kernels/half.h"

namespace rg::kernels::cpu {

void float_to_half_f16c(const float* src, Half* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (int64_t j = i; j < i + 8; ++j) dst[j] = float_to_half(src[j]);
      continue;
    }
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

void half_to_float_f16c(const Half* src, float* dst, int64_t n) {
  int64_t i = 0;
  const __m128i exponent = _mm_set1_epi16(0x7c00);
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    // An all-ones exponent (inf or NaN): the scalar path keeps NaN bits as half_to_float does.
    if (_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(h, exponent), exponent)) != 0) {
      for (int64_t j = i; j < i + 8; ++j) dst[j] = half_to_float(src[j]);
      continue;
    }
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

}  // namespace rg::kernels::cpu
