// CUDA's synchronization, warp and atomic intrinsics under emulation: __syncthreads, __syncwarp,
// shuffles and votes switch fibers through the block scheduler; atomics use std::atomic_ref.
#pragma once

#include <atomic>
#include <cstring>
#include <source_location>
#include <type_traits>

#include "kernels/emu/half_types.h"

namespace rg::emu::detail {

// Every blocking intrinsic takes the caller's source location (a defaulted argument), so that a
// barrier reached by only some threads is reported with the place where the others wait.
using Site = std::source_location;

enum class WarpOp : unsigned char {
  kSync,
  kShuffleIdx,
  kShuffleUp,
  kShuffleDown,
  kShuffleXor,
  kBallot,
  kAny,
  kAll,
};

struct WarpCall {
  WarpOp op;
  const char* name;  // the intrinsic, for error messages
  unsigned int mask;
  int arg = 0;     // source lane, delta or lane mask of a shuffle
  int width = 32;  // shuffle segment width
  int predicate = 0;
  unsigned int size = 0;  // bytes of a shuffled value
  const void* in = nullptr;
  void* out = nullptr;
};

// Implemented by the block scheduler (kernels/emu/block_runner.cpp). They throw rg::Error when
// called outside an emulated kernel.
int sync_block(const char* name, int predicate, const Site& site);
unsigned int warp_collective(const WarpCall& call, const Site& site);
[[noreturn]] void trap(const Site& site);

// The current block's dynamic shared memory (RG_DYNAMIC_SHARED), set by the block scheduler.
inline thread_local unsigned char* tls_dynamic_shared = nullptr;

template <class T>
inline constexpr bool kShuffleable =
    std::is_arithmetic_v<T> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16> ||
    std::is_same_v<T, __half2> || std::is_same_v<T, __nv_bfloat162>;

template <class T>
T shuffle(WarpOp op, const char* name, unsigned int mask, T var, int arg, int width,
          const Site& site) {
  static_assert(kShuffleable<T> && sizeof(T) <= 8, "CUDA shuffles take arithmetic/half types");
  T out;
  warp_collective(WarpCall{.op = op,
                           .name = name,
                           .mask = mask,
                           .arg = arg,
                           .width = width,
                           .size = sizeof(T),
                           .in = &var,
                           .out = &out},
                  site);
  return out;
}

template <class T, class Op>
T atomic_update(T* address, Op op) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load(std::memory_order_relaxed);
  while (!ref.compare_exchange_weak(old, op(old))) {
  }
  return old;
}

template <class H>
H atomic_add_half(H* address, H value) {
  std::atomic_ref<unsigned short> ref(address->__x);
  unsigned short old = ref.load(std::memory_order_relaxed);
  H next;
  do {
    H current;
    current.__x = old;
    next = current + value;
  } while (!ref.compare_exchange_weak(old, next.__x));
  H result;
  result.__x = old;
  return result;
}

}  // namespace rg::emu::detail

// ---- barriers ----------------------------------------------------------------------------------

inline void __syncthreads(const rg::emu::detail::Site& site = rg::emu::detail::Site::current()) {
  rg::emu::detail::sync_block("__syncthreads()", 0, site);
}
inline int __syncthreads_count(
    int predicate, const rg::emu::detail::Site& site = rg::emu::detail::Site::current()) {
  return rg::emu::detail::sync_block("__syncthreads_count()", predicate != 0, site);
}
inline int __syncthreads_and(int predicate,
                             const rg::emu::detail::Site& site = rg::emu::detail::Site::current()) {
  return rg::emu::detail::sync_block("__syncthreads_and()", predicate != 0, site) ==
         static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
}
inline int __syncthreads_or(int predicate,
                            const rg::emu::detail::Site& site = rg::emu::detail::Site::current()) {
  return rg::emu::detail::sync_block("__syncthreads_or()", predicate != 0, site) > 0;
}

inline void __syncwarp(unsigned int mask = 0xffffffffu,
                       const rg::emu::detail::Site& site = rg::emu::detail::Site::current()) {
  using rg::emu::detail::WarpOp;
  rg::emu::detail::warp_collective({.op = WarpOp::kSync, .name = "__syncwarp", .mask = mask}, site);
}

// ---- warp shuffles and votes -------------------------------------------------------------------

template <class T>
T __shfl_sync(unsigned int mask, T var, int src_lane, int width = warpSize,
              const rg::emu::detail::Site& site = rg::emu::detail::Site::current()) {
  return rg::emu::detail::shuffle(rg::emu::detail::WarpOp::kShuffleIdx, "__shfl_sync", mask, var,
                                  src_lane, width, site);
}
template <class T>
T __shfl_up_sync(unsigned int mask, T var, unsigned int delta, int width = warpSize,
                 const rg::emu::detail::Site& site = rg::emu::detail::Site::current()) {
  return rg::emu::detail::shuffle(rg::emu::detail::WarpOp::kShuffleUp, "__shfl_up_sync", mask, var,
                                  static_cast<int>(delta), width, site);
}
template <class T>
T __shfl_down_sync(unsigned int mask, T var, unsigned int delta, int width = warpSize,
                   const rg::emu::detail::Site& site = rg::emu::detail::Site::current()) {
  return rg::emu::detail::shuffle(rg::emu::detail::WarpOp::kShuffleDown, "__shfl_down_sync", mask,
                                  var, static_cast<int>(delta), width, site);
}
template <class T>
T __shfl_xor_sync(unsigned int mask, T var, int lane_mask, int width = warpSize,
                  const rg::emu::detail::Site& site = rg::emu::detail::Site::current()) {
  return rg::emu::detail::shuffle(rg::emu::detail::WarpOp::kShuffleXor, "__shfl_xor_sync", mask,
                                  var, lane_mask, width, site);
}

inline unsigned int __ballot_sync(
    unsigned int mask, int predicate,
    const rg::emu::detail::Site& site = rg::emu::detail::Site::current()) {
  using rg::emu::detail::WarpOp;
  return rg::emu::detail::warp_collective(
      {.op = WarpOp::kBallot, .name = "__ballot_sync", .mask = mask, .predicate = predicate != 0},
      site);
}
inline int __any_sync(unsigned int mask, int predicate,
                      const rg::emu::detail::Site& site = rg::emu::detail::Site::current()) {
  using rg::emu::detail::WarpOp;
  return static_cast<int>(rg::emu::detail::warp_collective(
      {.op = WarpOp::kAny, .name = "__any_sync", .mask = mask, .predicate = predicate != 0}, site));
}
inline int __all_sync(unsigned int mask, int predicate,
                      const rg::emu::detail::Site& site = rg::emu::detail::Site::current()) {
  using rg::emu::detail::WarpOp;
  return static_cast<int>(rg::emu::detail::warp_collective(
      {.op = WarpOp::kAll, .name = "__all_sync", .mask = mask, .predicate = predicate != 0}, site));
}

// ---- atomics: the overloads CUDA declares, really atomic because blocks run in parallel --------

#define RG_EMU_ATOMIC_ARITH(T)                                                  \
  inline T atomicAdd(T* a, T v) { return std::atomic_ref<T>(*a).fetch_add(v); } \
  inline T atomicExch(T* a, T v) { return std::atomic_ref<T>(*a).exchange(v); } \
  inline T atomicCAS(T* a, T compare, T v) {                                    \
    std::atomic_ref<T>(*a).compare_exchange_strong(compare, v);                 \
    return compare;                                                             \
  }
RG_EMU_ATOMIC_ARITH(int)
RG_EMU_ATOMIC_ARITH(unsigned int)
RG_EMU_ATOMIC_ARITH(unsigned long long)
#undef RG_EMU_ATOMIC_ARITH

#define RG_EMU_ATOMIC_INTEGER(T)                                                        \
  inline T atomicMax(T* a, T v) {                                                       \
    return rg::emu::detail::atomic_update(a, [v](T old) { return old < v ? v : old; }); \
  }                                                                                     \
  inline T atomicMin(T* a, T v) {                                                       \
    return rg::emu::detail::atomic_update(a, [v](T old) { return v < old ? v : old; }); \
  }                                                                                     \
  inline T atomicAnd(T* a, T v) { return std::atomic_ref<T>(*a).fetch_and(v); }         \
  inline T atomicOr(T* a, T v) { return std::atomic_ref<T>(*a).fetch_or(v); }           \
  inline T atomicXor(T* a, T v) { return std::atomic_ref<T>(*a).fetch_xor(v); }
RG_EMU_ATOMIC_INTEGER(int)
RG_EMU_ATOMIC_INTEGER(unsigned int)
RG_EMU_ATOMIC_INTEGER(long long)
RG_EMU_ATOMIC_INTEGER(unsigned long long)
#undef RG_EMU_ATOMIC_INTEGER

inline int atomicSub(int* a, int v) { return std::atomic_ref<int>(*a).fetch_sub(v); }
inline unsigned int atomicSub(unsigned int* a, unsigned int v) {
  return std::atomic_ref<unsigned int>(*a).fetch_sub(v);
}
inline unsigned int atomicInc(unsigned int* a, unsigned int v) {
  return rg::emu::detail::atomic_update(a,
                                        [v](unsigned int old) { return old >= v ? 0 : old + 1; });
}
inline unsigned int atomicDec(unsigned int* a, unsigned int v) {
  return rg::emu::detail::atomic_update(
      a, [v](unsigned int old) { return old == 0 || old > v ? v : old - 1; });
}
inline float atomicAdd(float* a, float v) { return std::atomic_ref<float>(*a).fetch_add(v); }
inline double atomicAdd(double* a, double v) { return std::atomic_ref<double>(*a).fetch_add(v); }
inline float atomicExch(float* a, float v) { return std::atomic_ref<float>(*a).exchange(v); }
inline __half atomicAdd(__half* a, __half v) { return rg::emu::detail::atomic_add_half(a, v); }
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* a, __nv_bfloat16 v) {
  return rg::emu::detail::atomic_add_half(a, v);
}

// ---- memory ordering, loads, traps -------------------------------------------------------------

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <class T>
T __ldg(const T* p) {
  return *p;
}
inline void __nanosleep(unsigned int) {}
[[noreturn]] inline void __trap(
    const rg::emu::detail::Site& site = rg::emu::detail::Site::current()) {
  rg::emu::detail::trap(site);
}
