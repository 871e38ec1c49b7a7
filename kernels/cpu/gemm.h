// Row-major GEMM on raw pointers through OpenBLAS: C = alpha * op(A) * op(B) + beta * C. The
// CPU-internal BLAS call (the CPU convolution and benchmarks use it directly); ops go through
// kernels/gemm.h's Gemm<B>, which also handles empty problems and checks BLAS's int range.
#pragma once

#include <cstdint>

namespace rg::kernels::cpu {

// op(A) is m x k, op(B) is k x n, C is m x n; lda/ldb/ldc are row strides of the stored matrices.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// While our own workers each run GEMMs, OpenBLAS must not start threads of its own: two thread
// pools on the same cores make each other wait (an idle pool spins before it sleeps). In scope,
// OpenBLAS runs single-threaded; afterwards it gets num_threads() back.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;
};

}  // namespace rg::kernels::cpu
