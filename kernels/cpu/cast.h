// Element conversions among all storage types (f16/bf16 round to nearest even; floating values
// truncate toward zero into integers, into u8 through int64 as in PyTorch).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/half.h"

namespace rg::kernels::cpu {

template <class To, class From>
inline To convert(From x) {
  if constexpr (std::is_same_v<From, Half>) {
    return convert<To>(half_to_float(x));
  } else if constexpr (std::is_same_v<From, BFloat16>) {
    return convert<To>(bfloat16_to_float(x));
  } else if constexpr (std::is_same_v<To, Half>) {
    return float_to_half(static_cast<float>(x));
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    return float_to_bfloat16(static_cast<float>(x));
  } else if constexpr (std::is_same_v<To, uint8_t> && std::is_floating_point_v<From>) {
    // Through int64 as PyTorch does (c10 TypeCast), so -1.0 -> 255 on every device instead of
    // the undefined behaviour of a direct conversion of a negative value.
    return static_cast<uint8_t>(static_cast<int64_t>(x));
  } else {
    return static_cast<To>(x);
  }
}

// dst[i] = convert<To>(src[i]) for i < n.
template <class From, class To>
void cast(const From* src, To* dst, int64_t n);

}  // namespace rg::kernels::cpu
