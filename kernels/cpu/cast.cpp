// Casts between every pair of storage types, instantiated here once.
#include "kernels/cpu/cast.h"

#include "kernels/cpu/parallel.h"

namespace rg::kernels::cpu {

template <class From, class To>
void cast(const From* src, To* dst, int64_t n) {
  parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
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
