// The CUDA emulation header: with it a .cu file compiles as C++ and its kernels run on the CPU
// (DESIGN section 5). rg_add_emulated_cuda_sources() includes it before every emulated .cu file.
//
// Model: every block runs on one OS thread of a small pool (blocks in parallel); the threads of a
// block are fibers on that OS thread which switch at __syncthreads() and warp collectives. A
// barrier that some threads cannot reach is reported as an rg::Error naming the block, the
// threads and the source locations. Rules for .cu authors, so one source builds both ways:
//  - dynamic shared memory: RG_DYNAMIC_SHARED(T, name) declares `T* name` (not extern __shared__);
//  - launch through RG_LAUNCH (kernels/cuda/check.h); a launch is queued on its stream and runs
//    asynchronously, as on a GPU (kernels/emu/device_runtime.h);
//  - every thread of a block reaches every __syncthreads() (no early return before one), and
//    every lane in a warp collective's mask calls it: anything else is reported as an error;
//  - no __CUDA_ARCH__-only code paths, no __activemask(), no cooperative groups; from cuBLAS and
//    cuDNN only what emu/shim/cublas_v2.h and emu/shim/cudnn.h provide (computed on the CPU).
// Semantics the emulator chooses where CUDA leaves them undefined: threads of a block run in
// index order up to their next barrier (so a missing __syncthreads() shows as wrong results);
// a shuffle from a lane outside the mask returns the caller's own value; lanes past the end of a
// partial last warp are left out of a full mask.
#pragma once

#ifndef RG_CUDA_EMU
#define RG_CUDA_EMU 1
#endif

#include "kernels/emu/builtins.h"
#include "kernels/emu/device_math.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/emu/half_types.h"
#include "kernels/emu/intrinsics.h"
#include "kernels/emu/launch.h"
#include "kernels/emu/runtime_api.h"

// Function and variable qualifiers: all code is host code here.
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

// A __shared__ variable is per block. Unchecked: one copy per OS thread (every thread of the
// process carries one, so keep them to the usual shared-memory sizes), which all fibers of the
// running block share. Checked (RG_EMU_CHECKED): a plain static, which AddressSanitizer surrounds
// with redzones (it does not instrument thread_local), with the blocks run on one OS thread. GCC
// gives no redzones to statics of inline or template functions with external linkage (keep
// kernels in an anonymous namespace); -fsanitize=bounds still checks s[i] against every bound.
#if RG_EMU_CHECKED
#define __shared__ static
#else
#define __shared__ static thread_local
#endif

// `extern __shared__ T name[]` cannot be emulated (its storage is per launch); this spelling
// works in both builds (see kernels/cuda/check.h for nvcc's). Aligned to at least 16 bytes.
#define RG_DYNAMIC_SHARED(T, name) \
  T* name = reinterpret_cast<T*>(::rg::emu::detail::tls_dynamic_shared)
