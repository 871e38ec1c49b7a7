// Helpers for comparing emulated CUDA kernels in every floating storage type with CPU kernels
// that exist in f32/f64 only: the CPU reference runs in f32 for f16/bf16 inputs and its result is
// rounded once, as the CUDA kernels do; plus bit-exact comparison and a loop over the types.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "emu/kernels/kernel_test_util.h"
#include "kernels/cpu/cast.h"
#include "kernels/half.h"

namespace rg::emu_kernel_test {

template <class T>
constexpr bool kIsHalfType = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// The type the CPU reference computes in for storage type T.
template <class T>
using ref_t = std::conditional_t<kIsHalfType<T>, float, T>;

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "f32";
  if constexpr (std::is_same_v<T, double>) return "f64";
  if constexpr (std::is_same_v<T, Half>) return "f16";
  if constexpr (std::is_same_v<T, BFloat16>) return "bf16";
  if constexpr (std::is_same_v<T, int64_t>) return "i64";
  if constexpr (std::is_same_v<T, int32_t>) return "i32";
  if constexpr (std::is_same_v<T, uint8_t>) return "u8";
  return "other";
}

template <class To, class From>
std::vector<To> convert_all(const std::vector<From>& v) {
  std::vector<To> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = kernels::cpu::convert<To>(v[i]);
  return out;
}

// Exact for every T (f16/bf16 widen to f32 without rounding).
template <class T>
std::vector<ref_t<T>> widen(const std::vector<T>& v) {
  return convert_all<ref_t<T>>(v);
}
// Rounds a reference result to the storage type, once, to nearest even.
template <class T>
std::vector<T> narrow(const std::vector<ref_t<T>>& v) {
  return convert_all<T>(v);
}

// The bits of got[i] and want[i] agree for every i; reports the first difference only.
template <class T>
void expect_bits_equal(const std::vector<T>& got, const std::vector<T>& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " of " << got.size() << " is "
                    << as_double(got[i]) << ", expected " << as_double(want[i]) << " (bits differ)";
      return;
    }
  }
}

// Calls f.template operator()<T>() for each T of Ts in order, naming T in failure messages.
template <class... Ts, class F>
void for_types(F&& f) {
  const auto one = [&]<class T>() {
    SCOPED_TRACE(type_name<T>());
    f.template operator()<T>();
  };
  (one.template operator()<Ts>(), ...);
}

// For T = f32, f64, f16, bf16.
template <class F>
void for_each_float_type(F&& f) {
  for_types<float, double, Half, BFloat16>(f);
}

// For T = i64, i32, u8.
template <class F>
void for_each_integer_type(F&& f) {
  for_types<int64_t, int32_t, uint8_t>(f);
}

// "f16 n=33": for failure messages.
template <class T>
std::string label(const std::string& what, int64_t n) {
  return what + " " + type_name<T>() + " n=" + std::to_string(n);
}

}  // namespace rg::emu_kernel_test
