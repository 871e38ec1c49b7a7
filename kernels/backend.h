// What every kernel of ringgrad shares across the two backends (DESIGN.md section 3):
//   - the backend tags Cpu and Cuda. An op's kernels are declared once, as static member templates
//     of a class template over the backend (kernels/loss.h: Loss<B>::softmax), and defined
//     by kernels/cpu/<op>.cpp for Loss<Cpu> and kernels/cuda/<op>.cu for Loss<Cuda>, so both
//     backends have the same signature by construction and the engine calls Loss<B>::... once;
//   - Ctx, the execution context every kernel takes last: the stream on CUDA, the thread budget
//     on the CPU;
//   - the dtype lists of each backend and RG_INSTANTIATE, which instantiates a backend's kernels
//     for every dtype of its list from one function listing them.
#pragma once

#include <cstdint>
#include <tuple>
#include <type_traits>

#include "kernels/half.h"

namespace rg::kernels {

struct Cpu {};
struct Cuda {};

template <class B>
inline constexpr bool is_cuda_backend = std::is_same_v<B, Cuda>;

// Where a kernel runs. CUDA kernels are enqueued on `stream` (a cudaStream_t; null is the legacy
// default stream) and return without waiting; CPU kernels run to completion on the calling thread
// and its OpenMP team of at most `threads` threads (0: kernels::cpu::num_threads()).
struct Ctx {
  void* stream = nullptr;
  int threads = 0;
};

// Scratch memory a kernel may need (on the kernel's device), with its size in bytes. The
// kernel's `<name>_workspace_bytes` function says how much to allocate; the two backends may need
// different amounts (the CPU often none).
struct Workspace {
  void* data = nullptr;
  int64_t bytes = 0;
};

}  // namespace rg::kernels

// The floating dtypes each backend's kernels are instantiated for: CPU kernels compute in f32 and
// f64; CUDA kernels also store f16 and bf16 (computing in f32). engine/dispatch.h routes exactly
// these (dispatch_float, dispatch_cuda_float). LIST(X, arg) expands X(arg, T) for each type T.
#define RG_CPU_FLOAT_TYPES(X, arg) X(arg, float) X(arg, double)
#define RG_CUDA_FLOAT_TYPES(X, arg) \
  X(arg, float) X(arg, double) X(arg, ::rg::Half) X(arg, ::rg::BFloat16)
// The half types alone (kernels with a mixed-precision variant: f16/bf16 data, f32 parameters).
#define RG_CUDA_HALF_TYPES(X, arg) X(arg, ::rg::Half) X(arg, ::rg::BFloat16)

// RG_INSTANTIATE(LIST, fn): explicit instantiation of `template <class T> auto fn()` for every
// type of LIST (RG_CPU_FLOAT_TYPES, RG_CUDA_FLOAT_TYPES or RG_CUDA_HALF_TYPES). fn returns the
// addresses of the kernels to instantiate, e.g.
//   template <class T> auto cpu_loss_kernels() { return std::tuple{&Loss<Cpu>::softmax<T>}; }
//   RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_loss_kernels)
// Taking a kernel's address instantiates it in this translation unit, where its definition is,
// so a kernel's parameters are never restated for its instantiations. fn must have external
// linkage (not in an unnamed namespace, or it and the kernels it names may not be emitted) and a
// name unique to its file (cpu_..., cuda_...).
#define RG_INSTANTIATE_ONE_(fn, T) template auto fn<T>();
#define RG_INSTANTIATE(LIST, fn) LIST(RG_INSTANTIATE_ONE_, fn)
