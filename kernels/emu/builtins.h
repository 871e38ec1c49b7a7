// The CUDA built-in types and variables under emulation: dim3/uint3, the vector types, warpSize
// and threadIdx/blockIdx/blockDim/gridDim (per OS thread, updated by the block scheduler).
#pragma once

#include <cstddef>

// Global namespace and CUDA's own names (uint3, dim3, float4, ...) so that code mangles the same
// way as with the real headers and kernels need no changes.
#define RG_EMU_VECTOR_TYPES(T, name, a2, a4)                                    \
  struct alignas(a2) name##2 {                                                  \
    T x, y;                                                                     \
  };                                                                            \
  struct name##3 {                                                              \
    T x, y, z;                                                                  \
  };                                                                            \
  struct alignas(a4) name##4 {                                                  \
    T x, y, z, w;                                                               \
  };                                                                            \
  constexpr name##2 make_##name##2(T x, T y) { return name##2 {x, y}; }         \
  constexpr name##3 make_##name##3(T x, T y, T z) { return name##3 {x, y, z}; } \
  constexpr name##4 make_##name##4(T x, T y, T z, T w) { return name##4 {x, y, z, w}; }

// Vector types with CUDA's sizes and alignments (kernels use them for vectorized loads).
RG_EMU_VECTOR_TYPES(float, float, 8, 16)
RG_EMU_VECTOR_TYPES(double, double, 16, 16)
RG_EMU_VECTOR_TYPES(int, int, 8, 16)
RG_EMU_VECTOR_TYPES(unsigned int, uint, 8, 16)
RG_EMU_VECTOR_TYPES(long long, longlong, 16, 16)
RG_EMU_VECTOR_TYPES(unsigned long long, ulonglong, 16, 16)
RG_EMU_VECTOR_TYPES(short, short, 4, 8)
RG_EMU_VECTOR_TYPES(unsigned short, ushort, 4, 8)
RG_EMU_VECTOR_TYPES(signed char, char, 2, 4)
RG_EMU_VECTOR_TYPES(unsigned char, uchar, 2, 4)
#undef RG_EMU_VECTOR_TYPES

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// warpSize is a run-time variable in CUDA; a constant here is a superset of that.
inline constexpr int warpSize = 32;

// Fibers of one block all run on one OS thread, and the scheduler writes these before it resumes
// a fiber, so per-OS-thread variables give every emulated thread its own view.
inline thread_local uint3 threadIdx{};
inline thread_local uint3 blockIdx{};
inline thread_local dim3 blockDim{};
inline thread_local dim3 gridDim{};
