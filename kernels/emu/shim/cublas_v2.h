// Stands in for <cublas_v2.h> in emulated builds: the subset of cuBLAS that kernels/cuda uses
// (handles, streams, workspaces and cublasGemmEx), computed on the CPU by kernels/cpu/gemm
// (kernels/emu/cublas.cpp). Matrices are column-major, as in cuBLAS. TF32 compute rounds the f32
// operands to TF32 and multiplies them in f32 (NVIDIA_TF32_OVERRIDE=0 turns it off); f16/bf16 operands are converted to f32,
// multiplied with f32 accumulation, and the result rounded once.
#pragma once

#include "kernels/emu/runtime_api.h"

// cuBLAS's and library_types.h's own enumerator values.
typedef enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_16BF = 14,
} cudaDataType;

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;

typedef enum {
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_64F = 70,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;

typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

typedef struct cublasContext* cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes);
const char* cublasGetStatusString(cublasStatus_t status);
// C = alpha * op(A) * op(B) + beta * C (column-major); alpha and beta are double for
// CUBLAS_COMPUTE_64F and float otherwise, and A, B, C share one type.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);

namespace rg::emu {
// RG_CUDA_CHECK for cuBLAS statuses under emulation (kernels/cuda/check.h).
void check_status(cublasStatus_t status, const char* call, const char* file, int line);
}  // namespace rg::emu
