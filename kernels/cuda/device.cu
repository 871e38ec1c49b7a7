// Device discovery (0 devices without a driver or GPU), library versions, and a one-kernel
// self-test. The first translation unit of the CUDA backend.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"

#include <dlfcn.h>

namespace rg::cuda {
namespace {

__global__ void fill_kernel(float* out, float value, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

}  // namespace

bool built_with_cuda() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string unavailable_reason() {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status == cudaSuccess) return n > 0 ? "" : "the CUDA driver reports no GPU";
  (void)cudaGetLastError();
  // The static runtime loads the driver itself and, without one, reports an "insufficient driver";
  // say plainly when there is none at all.
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) {
    const char* reason = dlerror();
    return ::rg::detail::cat("no CUDA driver is installed (", reason ? reason : "libcuda.so.1",
                             ")");
  }
  dlclose(driver);
  return ::rg::detail::cat("the CUDA driver cannot be used (cudaGetDeviceCount: ",
                           cudaGetErrorString(status), ")");
}

std::string device_name(int index) {
  const int n = device_count();
  RG_CHECK(index >= 0 && index < n, "cuda device ", index, " does not exist (", n,
           " devices visible)");
  cudaDeviceProp prop{};
  RG_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return ::rg::detail::cat(prop.name, " (sm_", prop.major, prop.minor, ")");
}

std::string library_versions() {
  int runtime = 0;
  RG_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  int cublas_major = 0, cublas_minor = 0, cublas_patch = 0;
  RG_CUDA_CHECK(cublasGetProperty(MAJOR_VERSION, &cublas_major));
  RG_CUDA_CHECK(cublasGetProperty(MINOR_VERSION, &cublas_minor));
  RG_CUDA_CHECK(cublasGetProperty(PATCH_LEVEL, &cublas_patch));
  int nccl = 0;
  RG_CUDA_CHECK(ncclGetVersion(&nccl));
  return ::rg::detail::cat("cudart ", runtime, ", cuBLAS ", cublas_major, ".", cublas_minor, ".",
                           cublas_patch, ", cuDNN ", cudnnGetVersion(), ", NCCL ", nccl);
}

void self_test(int index) {
  const int n = device_count();
  RG_CHECK(index >= 0 && index < n, "cuda self-test: device ", index, " does not exist (", n,
           " devices visible)");
  RG_CUDA_CHECK(cudaSetDevice(index));
  constexpr int kN = 1000;
  float* d = nullptr;
  RG_CUDA_CHECK(cudaMalloc(&d, kN * sizeof(float)));
  RG_LAUNCH(fill_kernel, (kN + 255) / 256, 256, 0, cudaStream_t{}, d, 3.5f, kN);
  float h[kN];
  const cudaError_t copy = cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
  RG_CUDA_CHECK(cudaFree(d));
  RG_CUDA_CHECK(copy);
  for (int i = 0; i < kN; ++i) {
    RG_CHECK(h[i] == 3.5f, "cuda self-test: element ", i, " is ", h[i], ", expected 3.5");
  }
}

}  // namespace rg::cuda
