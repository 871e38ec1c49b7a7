// The emulated cuBLAS subset of kernels/emu/shim/cublas_v2.h on kernels/cpu/gemm (OpenBLAS),
// queued on the handle's stream like any other work of the emulated device. TF32 compute rounds
// the f32 operands to TF32 first (kernels/emu/tf32.h).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cast.h"
#include "kernels/cpu/gemm.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/emu/shim/cublas_v2.h"
#include "kernels/emu/tf32.h"
#include "kernels/error.h"
#include "kernels/half.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  // cuBLAS allocates its workspace: a capture on this thread fails.
  if (rg::emu::refuse_during_capture(true)) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void*, size_t) {
  return handle == nullptr ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

namespace {

using rg::kernels::cpu::gemm;

// The column-major product as the row-major one of the transposes: C^T = op(B)^T op(A)^T, where a
// column-major matrix with leading dimension ld is its transpose stored row-major with row
// stride ld.
// k == 0 is C = beta * C (OpenBLAS rejects it).
template <class T>
void gemm_col_major(bool ta, bool tb, int m, int n, int k, T alpha, const T* a, int lda, const T* b,
                    int ldb, T beta, T* c, int ldc) {
  if (k == 0) {
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        T& v = c[size_t(j) * size_t(ldc) + size_t(i)];
        v = beta == T(0) ? T(0) : beta * v;
      }
    }
    return;
  }
  gemm<T>(tb, ta, n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
}

// A half-type operand of rows x cols (column-major, leading dimension ld) widened to f32: the
// ld * (cols - 1) + rows elements cuBLAS may read (the last column ends at `rows`).
template <class H>
std::vector<float> widen(const void* p, int ld, int rows, int cols) {
  const size_t extent = cols == 0 || rows == 0 ? 0 : size_t(ld) * size_t(cols - 1) + size_t(rows);
  std::vector<float> out(extent);
  rg::kernels::cpu::cast<H, float>(static_cast<const H*>(p), out.data(), int64_t(out.size()));
  return out;
}

// f32 operands rounded to TF32 (copies of what cuBLAS may read), then the f32 product.
void gemm_tf32(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc) {
  auto rounded = [](const float* p, int ld, int rows, int cols) {
    const size_t extent = cols == 0 || rows == 0 ? 0 : size_t(ld) * size_t(cols - 1) + size_t(rows);
    std::vector<float> out(p, p + extent);
    rg::emu::round_to_tf32(out.data(), out.size());
    return out;
  };
  const std::vector<float> at = rounded(a, lda, ta ? k : m, ta ? m : k);
  const std::vector<float> bt = rounded(b, ldb, tb ? n : k, tb ? k : n);
  gemm_col_major<float>(ta, tb, m, n, k, alpha, at.data(), lda, bt.data(), ldb, beta, c, ldc);
}

template <class H>
void gemm_half(bool ta, bool tb, int m, int n, int k, float alpha, const void* a, int lda,
               const void* b, int ldb, float beta, void* c, int ldc) {
  const std::vector<float> af = widen<H>(a, lda, ta ? k : m, ta ? m : k);
  const std::vector<float> bf = widen<H>(b, ldb, tb ? n : k, tb ? k : n);
  std::vector<float> cf = widen<H>(c, ldc, m, n);
  gemm_col_major<float>(ta, tb, m, n, k, alpha, af.data(), lda, bf.data(), ldb, beta, cf.data(),
                        ldc);
  rg::kernels::cpu::cast<float, H>(cf.data(), static_cast<H*>(c), int64_t(cf.size()));
}

}  // namespace

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (Atype != Btype || Atype != Ctype) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  // cuBLAS's leading-dimension rules: at least the stored rows, and at least 1.
  if (lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const bool f64 = computeType == CUBLAS_COMPUTE_64F;
  if (f64 ? Ctype != CUDA_R_64F
          : computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_TF32) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if ((!f64 && Ctype == CUDA_R_64F) ||
      (Ctype != CUDA_R_64F && Ctype != CUDA_R_32F && Ctype != CUDA_R_16F && Ctype != CUDA_R_16BF)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // Host scalars are read at the call, as cuBLAS does in host pointer mode.
  const double al = f64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double be = f64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  const size_t elem = Ctype == CUDA_R_64F ? 8 : Ctype == CUDA_R_32F ? 4 : 2;
  // The elements cuBLAS may touch: ld * (cols - 1) + rows.
  auto extent = [elem](int ld, int rows, int cols) {
    return cols == 0 || rows == 0 ? 0 : (size_t(ld) * size_t(cols - 1) + size_t(rows)) * elem;
  };
  const bool tf32 = computeType == CUBLAS_COMPUTE_32F_FAST_TF32 && Ctype == CUDA_R_32F &&
                    !rg::emu::tf32_overridden_off();
  std::vector<rg::emu::MemAccess> accesses = {{A, extent(lda, ta ? k : m, ta ? m : k), false},
                                              {B, extent(ldb, tb ? n : k, tb ? k : n), false},
                                              {C, extent(ldc, m, n), true}};
  rg::emu::enqueue(
      handle->stream, rg::detail::cat("cublasGemmEx(m=", m, ", n=", n, ", k=", k, ")"),
      std::move(accesses), [=] {
        switch (Ctype) {
          case CUDA_R_64F:
            gemm_col_major<double>(ta, tb, m, n, k, al, static_cast<const double*>(A), lda,
                                   static_cast<const double*>(B), ldb, be, static_cast<double*>(C),
                                   ldc);
            break;
          case CUDA_R_32F:
            if (tf32) {
              gemm_tf32(ta, tb, m, n, k, float(al), static_cast<const float*>(A), lda,
                        static_cast<const float*>(B), ldb, float(be), static_cast<float*>(C), ldc);
              break;
            }
            gemm_col_major<float>(ta, tb, m, n, k, float(al), static_cast<const float*>(A), lda,
                                  static_cast<const float*>(B), ldb, float(be),
                                  static_cast<float*>(C), ldc);
            break;
          case CUDA_R_16F:
            gemm_half<rg::Half>(ta, tb, m, n, k, float(al), A, lda, B, ldb, float(be), C, ldc);
            break;
          default:
            gemm_half<rg::BFloat16>(ta, tb, m, n, k, float(al), A, lda, B, ldb, float(be), C, ldc);
            break;
        }
      });
  return CUBLAS_STATUS_SUCCESS;
}

namespace rg::emu {
void check_status(cublasStatus_t status, const char* call, const char* file, int line) {
  RG_CHECK(status == CUBLAS_STATUS_SUCCESS, file, ":", line, ": ", call,
           " failed: ", cublasGetStatusString(status));
}
}  // namespace rg::emu
