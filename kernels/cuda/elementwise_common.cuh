// Device-side helpers shared by the elementwise-style kernels of kernels/cuda (included by .cu
// files only): storage <-> compute type mapping (f16/bf16 compute in f32), grid-stride launch
// geometry and the few math overloads that let one kernel body serve f32 and f64.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/half.h"

// `#pragma unroll n` for nvcc; nothing under the CPU emulator (GCC rejects the pragma).
#ifdef RG_CUDA_EMU
#define RG_UNROLL(n)
#else
#define RG_PRAGMA(x) _Pragma(#x)
#define RG_UNROLL(n) RG_PRAGMA(unroll n)
#endif

namespace rg::kernels::cuda::detail {

// Threads per block of every grid-stride kernel, and a grid cap: enough blocks to fill any current
// GPU several times over; larger arrays are covered by the grid-stride loop. 4095, not 4096: the
// CUDA emulator runs each thread's whole loop before the next thread's, and a stride of 2^20
// elements put all of a thread's elements in one CPU cache set (an emulated ToyNet run on real
// MNIST took 24 s instead of 16 s). A warp's accesses stay 128-byte aligned on a GPU: the stride,
// 256 * 4095 elements, is a multiple of 128 bytes for every element size.
inline constexpr int kThreads = 256;
inline constexpr int64_t kMaxBlocks = 4095;

inline unsigned int blocks_for(int64_t n) {
  return static_cast<unsigned int>(
      std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// The device storage type of a host storage type: rg::Half -> __half, rg::BFloat16 ->
// __nv_bfloat16 (same size and bits), anything else unchanged.
template <class T>
struct DeviceType {
  using type = T;
};
template <>
struct DeviceType<Half> {
  using type = __half;
};
template <>
struct DeviceType<BFloat16> {
  using type = __nv_bfloat16;
};
template <class T>
using device_t = typename DeviceType<T>::type;

template <class T>
device_t<T>* dev(T* p) {
  return reinterpret_cast<device_t<T>*>(p);
}
template <class T>
const device_t<T>* dev(const T* p) {
  return reinterpret_cast<const device_t<T>*>(p);
}

// A host value as a kernel argument of the device type (same bits).
template <class T>
device_t<T> to_device(T value) {
  if constexpr (std::is_same_v<T, Half>) {
    return __ushort_as_half(value.bits);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return __ushort_as_bfloat16(value.bits);
  } else {
    return value;
  }
}

// Loads in the compute type: f32 for f16/bf16, the storage type otherwise.
__device__ __forceinline__ float load(__half x) { return __half2float(x); }
__device__ __forceinline__ float load(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class D>
__device__ __forceinline__ D load(D x) {
  return x;
}
template <class D>
struct ComputeType {
  using type = D;
};
template <>
struct ComputeType<__half> {
  using type = float;
};
template <>
struct ComputeType<__nv_bfloat16> {
  using type = float;
};
template <class D>
using compute_t = typename ComputeType<D>::type;

// Stores a compute-type value, rounding to nearest even for f16/bf16 (doubles go through f32 first,
// like kernels/cpu/cast.h, so casts are bit-identical with the CPU).
template <class D, class A>
__device__ __forceinline__ D store(A x) {
  if constexpr (std::is_same_v<D, __half>) {
    return __float2half_rn(static_cast<float>(x));
  } else if constexpr (std::is_same_v<D, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(x));
  } else if constexpr (std::is_same_v<D, uint8_t> && std::is_floating_point_v<A>) {
    return static_cast<uint8_t>(static_cast<int64_t>(x));  // as kernels/cpu/cast.h (PyTorch)
  } else {
    return static_cast<D>(x);
  }
}

// inf or nan, from the bits (independent of fast-math settings).
__device__ __forceinline__ bool non_finite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}
__device__ __forceinline__ bool non_finite(double x) {
  return (static_cast<unsigned long long>(__double_as_longlong(x)) & 0x7ff0000000000000ull) ==
         0x7ff0000000000000ull;
}

// Math in the compute type. Qualified with :: because rg::kernels::cuda has its own tanh.
__device__ __forceinline__ float exp_(float x) { return ::expf(x); }
__device__ __forceinline__ double exp_(double x) { return ::exp(x); }
__device__ __forceinline__ float log_(float x) { return ::logf(x); }
__device__ __forceinline__ double log_(double x) { return ::log(x); }
__device__ __forceinline__ float sqrt_(float x) { return ::sqrtf(x); }
__device__ __forceinline__ double sqrt_(double x) { return ::sqrt(x); }
__device__ __forceinline__ float pow_(float x, float y) { return ::powf(x, y); }
__device__ __forceinline__ double pow_(double x, double y) { return ::pow(x, y); }
__device__ __forceinline__ float erf_(float x) { return ::erff(x); }
__device__ __forceinline__ double erf_(double x) { return ::erf(x); }
__device__ __forceinline__ float tanh_(float x) { return ::tanhf(x); }
__device__ __forceinline__ double tanh_(double x) { return ::tanh(x); }

// The first index of this thread and the stride of a 1-D grid-stride loop.
__device__ __forceinline__ int64_t grid_start() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(blockDim.x) * gridDim.x;
}

// Element i of a row-major box of ndim `sizes`, unravelled into its offsets through two stride
// arrays (a broadcast's operands, a strided copy's source and destination).
struct Offsets {
  int64_t first, second;
};
__device__ __forceinline__ Offsets unravel(int64_t i, int ndim, const int64_t* sizes,
                                           const int64_t* first_strides,
                                           const int64_t* second_strides) {
  Offsets o{0, 0};
  for (int d = ndim - 1; d >= 0; --d) {
    const int64_t idx = i % sizes[d];
    i /= sizes[d];
    o.first += idx * first_strides[d];
    o.second += idx * second_strides[d];
  }
  return o;
}

}  // namespace rg::kernels::cuda::detail
