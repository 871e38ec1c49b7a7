// Launchers of two tiny kernels (runtime_kernels.cu) for the emulated runtime's tests: plain C++
// declarations, so the tests need no CUDA header; pointers are emulated device memory.
#pragma once

namespace rg::emu_runtime_test {

// out[i] = value for i < n, queued on `stream` (a cudaStream_t; nullptr: the legacy stream).
void set_value(float* out, float value, int n, void* stream);
// out[i] = in[i] * factor for i < n: `in` is a const pointer, so the launch only reads it.
void scale(const float* in, float* out, float factor, int n, void* stream);

}  // namespace rg::emu_runtime_test
