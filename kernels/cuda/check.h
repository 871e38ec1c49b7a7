// One check macro for every CUDA, cuBLAS, cuDNN and NCCL status: throws rg::Error with
// file:line, the call and the library's message. Also the checked kernel launch helper.
#pragma once

#if defined(RG_CUDA_EMU)
// The .cu file is being compiled as C++ for the CPU emulator (kernels/emu/cuda_emu.h): launches
// run there and throw rg::Error themselves; only the emulated runtime's statuses can be checked.
#include "kernels/emu/cuda_emu.h"

#define RG_CUDA_CHECK(call) ::rg::emu::check_status((call), #call, __FILE__, __LINE__)

namespace rg::cuda::detail {
template <class Status>
inline void check(Status s, const char* call, const char* file, int line) {
  ::rg::emu::check_status(s, call, file, line);
}
}  // namespace rg::cuda::detail

// As on a GPU, the launch then checks cudaGetLastError(): an error an earlier call left behind
// fails it.
#define RG_LAUNCH(kernel, grid, block, shmem, stream, ...)                                 \
  do {                                                                                     \
    ::rg::emu::launch(::rg::emu::LaunchSite{#kernel, __FILE__, __LINE__}, (grid), (block), \
                      (shmem), (stream), kernel __VA_OPT__(, ) __VA_ARGS__);               \
    ::rg::emu::check_status(cudaGetLastError(), #kernel, __FILE__, __LINE__);              \
  } while (0)

#else  // nvcc

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include <string>

#include "kernels/error.h"
#include "kernels/nccl_error.h"

namespace rg::cuda::detail {

inline const char* status_message(cudaError_t s) { return cudaGetErrorString(s); }
inline const char* status_message(cublasStatus_t s) { return cublasGetStatusString(s); }
inline const char* status_message(cudnnStatus_t s) { return cudnnGetErrorString(s); }
// NCCL's own words and why the call failed (its last warning, kept even without NCCL_DEBUG).
inline std::string status_message(ncclResult_t s) {
  return ::rg::kernels::nccl_error_text(ncclGetErrorString(s), ncclGetLastError(nullptr));
}
inline bool ok(cudaError_t s) { return s == cudaSuccess; }
inline bool ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
inline bool ok(cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; }
inline bool ok(ncclResult_t s) { return s == ncclSuccess; }

// A failed runtime call leaves its error as the thread's last error, which the next launch's
// cudaGetLastError() would report as its own: taken here, since the exception reports it.
inline void clear_last_error(cudaError_t) { (void)cudaGetLastError(); }
template <class Status>
inline void clear_last_error(Status) {}

template <class Status>
inline void check(Status s, const char* call, const char* file, int line) {
  if (!ok(s)) [[unlikely]] {
    clear_last_error(s);
    ::rg::detail::throw_error(
        ::rg::detail::cat(file, ":", line, ": ", call, " failed: ", status_message(s)));
  }
}

}  // namespace rg::cuda::detail

#define RG_CUDA_CHECK(call) ::rg::cuda::detail::check((call), #call, __FILE__, __LINE__)

// Launches kernel<<<grid, block, shmem, stream>>>(args...) and checks cudaGetLastError().
#define RG_LAUNCH(kernel, grid, block, shmem, stream, ...)                      \
  do {                                                                          \
    kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__);                \
    ::rg::cuda::detail::check(cudaGetLastError(), #kernel, __FILE__, __LINE__); \
  } while (0)

// Dynamic shared memory as `T* name`, spelled the same in both builds (the emulator cannot
// provide `extern __shared__ T name[]`). One untyped array, so kernels of a file may differ in T.
#define RG_DYNAMIC_SHARED(T, name)                                         \
  extern __shared__ __align__(16) unsigned char rg_dynamic_shared_bytes[]; \
  T* name = reinterpret_cast<T*>(rg_dynamic_shared_bytes)

#endif  // RG_CUDA_EMU
