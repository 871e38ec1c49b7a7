// Row-major GEMM on device arrays through cuBLAS (cublasGemmEx), with kernels/cpu/gemm.h's
// conventions: C = alpha * op(A) * op(B) + beta * C, op(A) m x k, op(B) k x n, C m x n, and
// lda/ldb/ldc the row strides of the stored matrices. Plain C++ header: `stream` is a
// cudaStream_t.
#pragma once

#include <cstdint>

namespace rg::kernels::cuda {

// Device scratch bytes a gemm call may use (cuBLAS's recommendation for the current device: 32 MiB
// from compute capability 9.0, 4 MiB before). The caller allocates it (the engine: from the
// caching allocator, on the same stream) and passes it to gemm.
int64_t gemm_workspace_bytes();

// Instantiated for float (f32 compute; TF32 tensor cores when allow_tf32), double, and Half and
// BFloat16 (inputs and output in the half type, f32 accumulation). One cuBLAS handle per device
// and stream, created on first use and kept; `workspace` (workspace_bytes) is attached to it for
// the call.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, double beta, T* c, int64_t ldc, bool allow_tf32,
          void* workspace, int64_t workspace_bytes, void* stream);

}  // namespace rg::kernels::cuda
