// One check macro for every CUDA, cuBLAS, cuDNN and NCCL status: throws rg::Error with
// file:line, the call and the library's message. Also the checked kernel launch helper.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include <string>

#include "kernels/error.h"

namespace rg::cuda::detail {

inline const char* status_message(cudaError_t s) { return cudaGetErrorString(s); }
inline const char* status_message(cublasStatus_t s) { return cublasGetStatusString(s); }
inline const char* status_message(cudnnStatus_t s) { return cudnnGetErrorString(s); }
inline const char* status_message(ncclResult_t s) { return ncclGetErrorString(s); }
inline bool ok(cudaError_t s) { return s == cudaSuccess; }
inline bool ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
inline bool ok(cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; }
inline bool ok(ncclResult_t s) { return s == ncclSuccess; }

template <class Status>
inline void check(Status s, const char* call, const char* file, int line) {
  if (!ok(s)) [[unlikely]] {
    ::rg::detail::throw_error(::rg::detail::cat(file, ":", line, ": ", call, " failed: ",
                                                status_message(s)));
  }
}

}  // namespace rg::cuda::detail

#define RG_CUDA_CHECK(call) ::rg::cuda::detail::check((call), #call, __FILE__, __LINE__)

// Launches kernel<<<grid, block, shmem, stream>>>(args...) and checks cudaGetLastError().
#define RG_LAUNCH(kernel, grid, block, shmem, stream, ...)                          \
  do {                                                                              \
    kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__);                    \
    ::rg::cuda::detail::check(cudaGetLastError(), #kernel, __FILE__, __LINE__);     \
  } while (0)
