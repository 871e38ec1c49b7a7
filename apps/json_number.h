// Numbers out of untrusted JSON (traces, step profiles, flight recorder dumps): nlohmann's get<int>
// of 1e30 or of 2^40 converts out of range (undefined behaviour); these check first.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "kernels/error.h"

namespace rg::apps {

// `v` as an integer of type T: a JSON integer within T's range (and [lo, hi] when given), else an
// rg::Error saying "<what> ... is not ...".
template <class T>
T json_int(const nlohmann::json& v, const std::string& what,
           T lo = std::numeric_limits<T>::lowest(), T hi = std::numeric_limits<T>::max()) {
  bool ok = false;
  T out{};
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    ok = std::cmp_greater_equal(u, lo) && std::cmp_less_equal(u, hi);
    out = T(u);
  } else if (v.is_number_integer()) {
    const auto i = v.get<int64_t>();
    ok = std::cmp_greater_equal(i, lo) && std::cmp_less_equal(i, hi);
    out = T(i);
  }
  RG_CHECK(ok, what, " ", v.dump(), " is not an integer in [", +lo, ", ", +hi, "]");
  return out;
}

// The member `key` of object `o` as json_int, or `fallback` when it is absent.
template <class T>
T json_int_or(const nlohmann::json& o, const char* key, T fallback, const std::string& what,
              T lo = std::numeric_limits<T>::lowest(), T hi = std::numeric_limits<T>::max()) {
  const auto it = o.find(key);
  return it == o.end() ? fallback : json_int<T>(*it, what, lo, hi);
}

// A finite double (a JSON number of any kind), else an rg::Error.
inline double json_finite(const nlohmann::json& v, const std::string& what) {
  RG_CHECK(v.is_number() && std::isfinite(v.get<double>()), what, " ", v.dump(),
           " is not a finite number");
  return v.get<double>();
}

}  // namespace rg::apps
