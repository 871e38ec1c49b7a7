// The dropout kernels, one contract for both backends (kernels/backend.h). The mask is drawn from
// Philox4x32-10 (kernels/philox.h): element i uses word i % 4 of counter offset + i / 4, and is
// kept (mask[i] = scale, usually 1 / (1 - p)) when that word's top 24 bits / 2^24 >= p, else
// dropped (mask[i] = 0). Both backends draw the same bits and compare exactly, so a mask depends
// only on (seed, offset), never on threads or device. The offset may add a number in device memory
// (philox::Offset::base, CUDA only: a CUDA graph's replays). kernels/cpu/dropout.cpp defines
// Dropout<Cpu> (f32, f64), kernels/cuda/dropout.cu Dropout<Cuda> (f32, f64, f16, bf16).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/error.h"
#include "kernels/philox.h"

namespace rg::kernels {

template <class B>
struct Dropout {
  // mask[i] as above, for i < n.
  template <class T>
  static void mask(T* mask, int64_t n, double p, T scale, uint64_t seed, philox::Offset offset,
                   Ctx ctx);
  // mask as above and out[i] = x[i] * mask[i] (in the compute type), in one pass.
  template <class T>
  static void forward(const T* x, T* out, T* mask, int64_t n, double p, T scale, uint64_t seed,
                      philox::Offset offset, Ctx ctx);
  // grad_in[i] = grad[i] * mask[i]
  template <class T>
  static void backward(const T* grad, const T* mask, T* grad_in, int64_t n, Ctx ctx);
};

namespace detail {

inline void check_dropout(const char* op, int64_t n, double p) {
  RG_CHECK(n >= 0, op, ": element count must be >= 0, got ", n);
  RG_CHECK(p >= 0.0 && p <= 1.0, op, ": probability p must be in [0, 1], got ", p);
}

// Element i is kept when to_uniform(w) >= p, where to_uniform(w) = (w >> 8) / 2^24 exactly; that
// is (w >> 8) >= p * 2^24, i.e. (w >> 8) >= ceil(p * 2^24) (p * 2^24 is exact in double; p = 1
// keeps nothing). Both backends compare with this integer threshold.
inline uint32_t dropout_keep_threshold(double p) {
  return static_cast<uint32_t>(std::ceil(p * 16777216.0));
}

}  // namespace detail
}  // namespace rg::kernels
