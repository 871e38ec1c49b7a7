// Row-major GEMM, one contract for both backends (kernels/backend.h):
// C = alpha * op(A) * op(B) + beta * C with op(A) m x k, op(B) k x n, C m x n, and lda/ldb/ldc the
// row strides of the stored matrices. kernels/cpu/gemm.cpp defines Gemm<Cpu> (f32, f64, through
// OpenBLAS), kernels/cuda/gemm.cu Gemm<Cuda> (f32 with TF32 tensor cores when allow_tf32, f64,
// and f16/bf16 with f32 accumulation, through cublasGemmEx: the row-major product is the
// column-major product of the transposes, so no operand is copied).
//
// Shared rules: sizes and leading dimensions must fit BLAS's int; m == 0 or n == 0 does nothing;
// k == 0 gives C = beta * C (C = 0 when beta == 0, whatever C held, as BLAS treats beta == 0);
// alpha and beta come in f64 and are used in the compute type. The workspace is scratch for
// cuBLAS (its recommendation for the current device: 32 MiB from compute capability 9.0, 4 MiB
// before; none on the CPU).
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg::kernels {

template <class B>
struct Gemm {
  static int64_t workspace_bytes(Ctx ctx);
  template <class T>
  static void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                   const T* a, int64_t lda, const T* b, int64_t ldb, double beta, T* c,
                   int64_t ldc, bool allow_tf32, Workspace workspace, Ctx ctx);
};

namespace detail {

// v as a BLAS int, or an rg::Error naming the argument.
inline int gemm_int(int64_t v, const char* what) {
  RG_CHECK(v >= 0 && v <= 2147483647, "gemm: ", what, " = ", v,
           " is outside BLAS's int range [0, 2147483647]");
  return static_cast<int>(v);
}

}  // namespace detail
}  // namespace rg::kernels
