// Two tiny kernels for the emulated runtime's tests (runtime_kernels.h): a kernel launch is one
// more kind of queued work, and its pointer parameters are what the race detector sees.
#include <cuda_runtime_api.h>

#include "emu/runtime/runtime_kernels.h"
#include "kernels/cuda/check.h"

namespace rg::emu_runtime_test {
namespace {

constexpr int kThreads = 128;

__global__ void set_value_kernel(float* out, float value, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = value;
}

__global__ void scale_kernel(const float* in, float* out, float factor, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = in[i] * factor;
}

unsigned int blocks(int n) { return static_cast<unsigned int>((n + kThreads - 1) / kThreads); }

}  // namespace

void set_value(float* out, float value, int n, void* stream) {
  if (n <= 0) return;
  RG_LAUNCH(set_value_kernel, blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream), out, value,
            n);
}

void scale(const float* in, float* out, float factor, int n, void* stream) {
  if (n <= 0) return;
  RG_LAUNCH(scale_kernel, blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream), in, out,
            factor, n);
}

}  // namespace rg::emu_runtime_test
