// Elementwise reductions for collectives; instantiated for every storage type.
#include "kernels/cpu/collective_reduce.h"

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/cast.h"
#include "kernels/half.h"

namespace rg::kernels::cpu {
namespace {

template <class T>
constexpr bool kIsHalfType = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <class T, class F>
void apply(T* out, const T* a, const T* b, int64_t n, F f) {
  if constexpr (kIsHalfType<T>) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = convert<T>(f(convert<float>(a[i]), convert<float>(b[i])));
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
  }
}

}  // namespace

template <class T>
void collective_reduce(CollectiveOp op, T* out, const T* a, const T* b, int64_t n) {
  switch (op) {
    case CollectiveOp::sum:
      apply(out, a, b, n, [](auto x, auto y) { return x + y; });
      break;
    case CollectiveOp::max:
      apply(out, a, b, n, [](auto x, auto y) { return std::max(x, y); });
      break;
    case CollectiveOp::min:
      apply(out, a, b, n, [](auto x, auto y) { return std::min(x, y); });
      break;
  }
}

template <class T>
void divide_by(T* x, int64_t n, int64_t divisor) {
  if (divisor == 1) return;
  if constexpr (kIsHalfType<T>) {
    const float d = float(divisor);
    for (int64_t i = 0; i < n; ++i) x[i] = convert<T>(convert<float>(x[i]) / d);
  } else {
    const T d = static_cast<T>(divisor);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<T>(x[i] / d);
  }
}

#define RG_INSTANTIATE(T)                                                            \
  template void collective_reduce<T>(CollectiveOp, T*, const T*, const T*, int64_t); \
  template void divide_by<T>(T*, int64_t, int64_t);
RG_INSTANTIATE(float)
RG_INSTANTIATE(double)
RG_INSTANTIATE(Half)
RG_INSTANTIATE(BFloat16)
RG_INSTANTIATE(int64_t)
RG_INSTANTIATE(int32_t)
RG_INSTANTIATE(uint8_t)
#undef RG_INSTANTIATE

}  // namespace rg::kernels::cpu
