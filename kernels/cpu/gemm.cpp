// OpenBLAS sgemm/dgemm behind one template (cpu::gemm, also used inside the CPU convolution), and
// Gemm<Cpu> (kernels/gemm.h) on it; empty problems are handled here, not in BLAS.
#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <tuple>

#include "kernels/gemm.h"

#include "kernels/cpu/parallel.h"

namespace rg::kernels::cpu {

template <>
void gemm<float>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  (void)num_threads();  // makes sure OpenBLAS got our thread count
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

template <>
void gemm<double>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                  int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  (void)num_threads();
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

extern "C" void openblas_set_num_threads(int);

SingleThreadedBlas::SingleThreadedBlas() { openblas_set_num_threads(1); }
SingleThreadedBlas::~SingleThreadedBlas() { openblas_set_num_threads(num_threads()); }

}  // namespace rg::kernels::cpu

namespace rg::kernels {

template <>
int64_t Gemm<Cpu>::workspace_bytes(Ctx) {
  return 0;
}

template <>
template <class T>
void Gemm<Cpu>::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                     const T* a, int64_t lda, const T* b, int64_t ldb, double beta, T* c,
                     int64_t ldc, bool, Workspace, Ctx) {
  detail::gemm_int(m, "m");
  detail::gemm_int(n, "n");
  detail::gemm_int(k, "k");
  detail::gemm_int(lda, "lda");
  detail::gemm_int(ldb, "ldb");
  detail::gemm_int(ldc, "ldc");
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS rejects the leading dimensions of an empty product
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? T(0) : T(beta) * c[i * ldc + j];
    }
    return;
  }
  cpu::gemm<T>(trans_a, trans_b, m, n, k, T(alpha), a, lda, b, ldb, T(beta), c, ldc);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_gemm_kernels() {
  return std::tuple{&Gemm<Cpu>::gemm<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_gemm_kernels)

}  // namespace rg::kernels
