// Casts between every pair of storage types, instantiated here once.
#include "kernels/cpu/cast.h"

#include "kernels/cpu/parallel.h"

namespace rg::kernels::cpu {

// cast_f16c.cpp: F16C builds of the f32 <-> f16 loops (autocast's f16 on the CPU converts every
// activation twice; the scalar conversions cost 3x the training step's time there).
void float_to_half_f16c(const float* src, Half* dst, int64_t n);
void half_to_float_f16c(const Half* src, float* dst, int64_t n);

namespace {
const bool kHasF16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
}

template <class From, class To>
void cast(const From* src, To* dst, int64_t n) {
  parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    if constexpr (std::is_same_v<From, float> && std::is_same_v<To, Half>) {
      if (kHasF16c) return float_to_half_f16c(src + lo, dst + lo, hi - lo);
    } else if constexpr (std::is_same_v<From, Half> && std::is_same_v<To, float>) {
      if (kHasF16c) return half_to_float_f16c(src + lo, dst + lo, hi - lo);
    }
    for (int64_t i = lo; i < hi; ++i) dst[i] = convert<To>(src[i]);
  });
}

#define RG_CAST_TO(FROM)                                                  \
  template void cast<FROM, float>(const FROM*, float*, int64_t);          \
  template void cast<FROM, double>(const FROM*, double*, int64_t);        \
  template void cast<FROM, Half>(const FROM*, Half*, int64_t);            \
  template void cast<FROM, BFloat16>(const FROM*, BFloat16*, int64_t);    \
  template void cast<FROM, int64_t>(const FROM*, int64_t*, int64_t);      \
  template void cast<FROM, int32_t>(const FROM*, int32_t*, int64_t);      \
  template void cast<FROM, uint8_t>(const FROM*, uint8_t*, int64_t);
RG_CAST_TO(float)
RG_CAST_TO(double)
RG_CAST_TO(Half)
RG_CAST_TO(BFloat16)
RG_CAST_TO(int64_t)
RG_CAST_TO(int32_t)
RG_CAST_TO(uint8_t)
#undef RG_CAST_TO

}  // namespace rg::kernels::cpu
