// Kernel launches under emulation: RG_LAUNCH (kernels/cuda/check.h) calls rg::emu::launch, which
// checks the configuration like the CUDA runtime and runs the blocks on a pool of OS threads.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/emu/builtins.h"
#include "kernels/emu/runtime_api.h"

namespace rg::emu {

// Where a launch comes from, for error messages.
struct LaunchSite {
  const char* kernel;
  const char* file;
  int line;
};

// The limits of the CUDA runtime (compute capability 8.x) that a launch is checked against.
inline constexpr unsigned int kMaxThreadsPerBlock = 1024;
inline constexpr unsigned int kMaxBlockDim[3] = {1024, 1024, 64};
inline constexpr unsigned int kMaxGridDim[3] = {2147483647u, 65535, 65535};
// Without cudaFuncSetAttribute opt-in, which the emulator does not model.
inline constexpr size_t kMaxDynamicSharedBytes = 48 * 1024;

using KernelThunk = void (*)(const void* bound);

// Runs thunk(bound) once in every thread of every block and returns when all have finished:
// emulated launches are synchronous, whatever the stream. Throws rg::Error for an invalid
// configuration, a barrier that not all threads reach and an rg::Error thrown by a kernel thread
// (with the launch, block and thread added to the message); other exceptions pass unchanged.
void launch_kernel(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                   KernelThunk thunk, const void* bound);

// Blocks run in parallel on this many OS threads: RG_EMU_THREADS, else min(hardware threads, 4);
// always 1 in the checked build, where __shared__ variables are plain statics.
int worker_count();
// Bytes of each fiber's stack: RG_EMU_STACK_KB, else 64 KiB (256 KiB in the checked build, whose
// sanitizer frames are larger). A guard page below each stack turns an overflow into SIGSEGV.
size_t fiber_stack_bytes();
void set_fiber_stack_bytes(size_t bytes);
// Whether this is the checked build (RG_EMU_CHECKED: ASan + bounds checks on shared memory).
bool checked_build();

// The emulated kernel<<<grid, block, shmem, stream>>>(args...): the arguments are converted to
// the kernel's parameter types once, and every thread receives its own copy, as in CUDA.
template <class... Params, class... Args>
void launch(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
            cudaStream_t /*stream*/, void (*kernel)(Params...), Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args),
                "kernel launched with a wrong argument count");
  using Tuple = std::tuple<std::remove_cvref_t<Params>...>;
  struct Bound {
    void (*kernel)(Params...);
    Tuple params;
  };
  const Bound bound{kernel, Tuple(std::forward<Args>(args)...)};
  launch_kernel(
      site, grid, block, dynamic_shared_bytes,
      [](const void* p) {
        const Bound& b = *static_cast<const Bound*>(p);
        std::apply(b.kernel, b.params);
      },
      &bound);
}

// RG_CUDA_CHECK for the emulated runtime calls (kernels/emu/runtime_api.h).
void check_status(cudaError_t status, const char* call, const char* file, int line);

}  // namespace rg::emu
