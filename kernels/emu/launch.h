// Kernel launches under emulation: RG_LAUNCH (kernels/cuda/check.h) calls rg::emu::launch, which
// checks the configuration like the CUDA runtime and queues the launch on its stream, whose worker
// runs the blocks on a pool of OS threads.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/emu/builtins.h"
#include "kernels/emu/device_runtime.h"
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

// Throws rg::Error for a configuration the CUDA runtime would refuse (at the launch, as CUDA
// reports it), or for a launch from inside an emulated kernel.
void check_launch(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes);
// Runs thunk(bound) once in every thread of every block and returns when all have finished (the
// stream worker's half of a launch). Throws rg::Error for a barrier that not all threads reach and
// for an rg::Error thrown by a kernel thread (with the launch, block and thread added to the
// message); other exceptions pass unchanged.
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

namespace detail {

// A kernel's pointer parameters are the memory it touches, as far as the race detector can tell:
// `const T*` is read, `T*` read and written, each from the pointer to the end of its block. A
// struct parameter that holds pointers (a multi-tensor list) names them itself with a member
// `void append_accesses(std::vector<MemAccess>&) const`.
template <class T>
void add_pointer_access(const T& value, std::vector<MemAccess>& out) {
  if constexpr (requires { value.append_accesses(out); }) {
    value.append_accesses(out);
  } else if constexpr (std::is_pointer_v<T> && !std::is_function_v<std::remove_pointer_t<T>>) {
    if (value != nullptr) {
      out.push_back(MemAccess{value, kToBlockEnd, !std::is_const_v<std::remove_pointer_t<T>>});
    }
  }
}

template <class Tuple, size_t... I>
std::vector<MemAccess> pointer_accesses(const Tuple& params, std::index_sequence<I...>) {
  std::vector<MemAccess> out;
  (add_pointer_access(std::get<I>(params), out), ...);
  return out;
}

}  // namespace detail

// The emulated kernel<<<grid, block, shmem, stream>>>(args...): the arguments are converted to
// the kernel's parameter types once, at the launch (as CUDA copies them), and the launch is queued
// on `stream`; every thread receives its own copy of the arguments.
template <class... Params, class... Args>
void launch(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
            cudaStream_t stream, void (*kernel)(Params...), Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args),
                "kernel launched with a wrong argument count");
  using Tuple = std::tuple<std::remove_cvref_t<Params>...>;
  struct Bound {
    void (*kernel)(Params...);
    Tuple params;
  };
  check_launch(site, grid, block, dynamic_shared_bytes);
  auto bound = std::make_shared<const Bound>(Bound{kernel, Tuple(std::forward<Args>(args)...)});
  std::vector<MemAccess> accesses =
      detail::pointer_accesses(bound->params, std::index_sequence_for<Params...>{});
  enqueue(stream, std::string("kernel ") + site.kernel, std::move(accesses),
          [site, grid, block, dynamic_shared_bytes, bound] {
            launch_kernel(
                site, grid, block, dynamic_shared_bytes,
                [](const void* p) {
                  const Bound& b = *static_cast<const Bound*>(p);
                  std::apply(b.kernel, b.params);
                },
                bound.get());
          });
}

// RG_CUDA_CHECK for the emulated runtime calls (kernels/emu/runtime_api.h).
void check_status(cudaError_t status, const char* call, const char* file, int line);

}  // namespace rg::emu
