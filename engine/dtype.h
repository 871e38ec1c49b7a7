// Element types of tensors and the mapping between them and C++ types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kernels/half.h"

namespace rg {

enum class DType : uint8_t { f32, f64, f16, bf16, i64, i32, u8 };

size_t element_size(DType t);
const char* dtype_name(DType t);
// The inverse of dtype_name ("f32", "bf16", ...); rg::Error for an unknown name.
DType parse_dtype(std::string_view name);
bool is_floating(DType t);
// f16 or bf16: the lower-precision types of autocast.
bool is_half(DType t);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}

}  // namespace rg
