// Counter-based Philox4x32-10 random numbers (Salmon et al., SC'11): the same (seed, counter)
// gives the same numbers on the CPU and in CUDA kernels, so random ops are reproducible anywhere.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/error.h"

#if defined(__CUDACC__)
#define RG_HOST_DEVICE __host__ __device__
#else
#define RG_HOST_DEVICE
#endif

namespace rg::philox {

// A random op's first Philox counter: `value`, plus the 64-bit number at `base` when base is set
// (device memory a CUDA graph refills before each replay, so that each replay draws new numbers:
// engine/cuda/graph.h). The CPU kernels take no base.
struct Offset {
  uint64_t value = 0;
  const int64_t* base = nullptr;

  // Implicit from a plain offset (the CPU's and eager calls').
  RG_HOST_DEVICE Offset(uint64_t v = 0, const int64_t* b = nullptr) : value(v), base(b) {}
  RG_HOST_DEVICE uint64_t resolve() const {
    return base != nullptr ? value + static_cast<uint64_t>(*base) : value;
  }
#if defined(RG_CUDA_EMU)
#if defined(RG_RUNTIME_NEUTRAL)
#error "kernels/philox.h differs under the emulator, so a test that includes it cannot be shared \
by the emulated and real programs: compile it per program (tests/CMakeLists.txt)"
#endif
  // The emulator's race detector sees the read of `base` (kernels/emu/launch.h).
  template <class Accesses>
  void append_accesses(Accesses& out) const {
    if (base != nullptr) out.push_back({base, sizeof(int64_t), false});
  }
#endif
};

// The offset of a CPU kernel, which cannot read device memory: one without a base.
inline uint64_t host_offset(const Offset& o, const char* op) {
  RG_CHECK(o.base == nullptr, op, ": a Philox offset in device memory (a CUDA graph's) on the CPU");
  return o.value;
}

struct U32x4 {
  uint32_t v[4];
};

RG_HOST_DEVICE inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

// Ten rounds of Philox4x32 on `counter` under `key`.
RG_HOST_DEVICE inline U32x4 philox4x32(U32x4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c.v[0], hi0, lo0);
    mulhilo(kM1, c.v[2], hi1, lo1);
    c = U32x4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// The four 32-bit words for element group `index` of the stream (seed, offset).
// Element i of a random op uses word i % 4 of group (offset + i / 4).
RG_HOST_DEVICE inline U32x4 block(uint64_t seed, uint64_t group) {
  return philox4x32(U32x4{{uint32_t(group), uint32_t(group >> 32), 0u, 0u}}, uint32_t(seed),
                    uint32_t(seed >> 32));
}

// Uniform in [0, 1) with 24 random bits (exactly representable in f32).
RG_HOST_DEVICE inline float to_uniform(uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }

// Uniform in [0, 1) with 53 random bits from two words.
RG_HOST_DEVICE inline double to_uniform_double(uint32_t a, uint32_t b) {
  const uint64_t x = (uint64_t(a) << 32 | b) >> 11;
  return double(x) * (1.0 / 9007199254740992.0);
}

// Box-Muller on words (a, b): one standard normal sample.
RG_HOST_DEVICE inline double box_muller(uint32_t a, uint32_t b) {
  const double u1 = 1.0 - double(a) * (1.0 / 4294967296.0);  // (0, 1]
  const double u2 = double(b) * (1.0 / 4294967296.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace rg::philox
