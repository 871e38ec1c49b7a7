// Gemm<Cuda> (kernels/gemm.h): cuBLAS GEMM for the engine's matmul and linear; the row-major
// product is computed as the column-major product of the transposes (C^T = op(B)^T op(A)^T), so
// no operand is copied.
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <map>
#include <tuple>
#include <mutex>
#include <type_traits>
#include <utility>

#include "kernels/cuda/check.h"
#include "kernels/gemm.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace rg::kernels::cuda {
namespace {

std::mutex handles_mu;

// The handle of (current device, stream), created on first use; never destroyed (cuBLAS handles
// live as long as their device context, like PyTorch's pool). Called with handles_mu held.
cublasHandle_t handle_for(void* stream) {
  static std::map<std::pair<int, void*>, cublasHandle_t> handles;
  int device = 0;
  RG_CUDA_CHECK(cudaGetDevice(&device));
  auto [it, inserted] = handles.try_emplace({device, stream}, nullptr);
  if (inserted) {
    cublasHandle_t h = nullptr;
    const cublasStatus_t status = cublasCreate(&h);
    if (status != CUBLAS_STATUS_SUCCESS) handles.erase(it);
    RG_CUDA_CHECK(status);
    RG_CUDA_CHECK(cublasSetStream(h, static_cast<cudaStream_t>(stream)));
    it->second = h;
  }
  return it->second;
}

template <class T>
constexpr cudaDataType data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  if constexpr (std::is_same_v<T, double>) return CUDA_R_64F;
  if constexpr (std::is_same_v<T, Half>) return CUDA_R_16F;
  if constexpr (std::is_same_v<T, BFloat16>) return CUDA_R_16BF;
}

}  // namespace
}  // namespace rg::kernels::cuda

namespace rg::kernels {

template <>
int64_t Gemm<Cuda>::workspace_bytes(Ctx) {
  int device = 0, major = 0;
  RG_CUDA_CHECK(cudaGetDevice(&device));
  RG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return (major >= 9 ? 32 : 4) * (int64_t(1) << 20);
}

template <>
template <class T>
void Gemm<Cuda>::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                      const T* a, int64_t lda, const T* b, int64_t ldb, double beta, T* c,
                      int64_t ldc, bool allow_tf32, Workspace ws, Ctx ctx) {
  using cuda::data_type;
  const int mi = detail::gemm_int(m, "m"), ni = detail::gemm_int(n, "n");
  const int ki = detail::gemm_int(k, "k");
  // cuBLAS requires leading dimensions >= 1 even for empty products (k == 0: C = beta * C).
  const int lda_i = std::max(1, detail::gemm_int(lda, "lda"));
  const int ldb_i = std::max(1, detail::gemm_int(ldb, "ldb"));
  const int ldc_i = std::max(1, detail::gemm_int(ldc, "ldc"));
  if (mi == 0 || ni == 0) return;
  void* workspace = ws.data;
  const int64_t workspace_bytes = ws.bytes;
  void* stream = ctx.stream;
  RG_CHECK(workspace_bytes >= 0 && (workspace != nullptr || workspace_bytes == 0),
           "gemm: a workspace of ", workspace_bytes, " bytes needs a pointer");
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  constexpr cudaDataType type = data_type<T>();
  std::lock_guard<std::mutex> lock(cuda::handles_mu);
  cublasHandle_t h = cuda::handle_for(stream);
  RG_CUDA_CHECK(cublasSetWorkspace(h, workspace, size_t(workspace_bytes)));
  if constexpr (std::is_same_v<T, double>) {
    RG_CUDA_CHECK(cublasGemmEx(h, op_b, op_a, ni, mi, ki, &alpha, b, type, ldb_i, a, type, lda_i,
                               &beta, c, type, ldc_i, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT));
  } else {
    const float alpha_f = float(alpha), beta_f = float(beta);
    const cublasComputeType_t compute =
        std::is_same_v<T, float> && allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    RG_CUDA_CHECK(cublasGemmEx(h, op_b, op_a, ni, mi, ki, &alpha_f, b, type, ldb_i, a, type, lda_i,
                               &beta_f, c, type, ldc_i, compute, CUBLAS_GEMM_DEFAULT));
  }
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cuda_gemm_kernels() {
  return std::tuple{&Gemm<Cuda>::gemm<T>};
}
RG_INSTANTIATE(RG_CUDA_FLOAT_TYPES, cuda_gemm_kernels)

}  // namespace rg::kernels
