// CUDA device discovery that never throws for a missing driver or GPU (returns 0 devices), and
// the versions of the CUDA libraries ringgrad loads. Public (installed as <ringgrad/kernels/cuda/device.h>,
// re-exported by <ringgrad/engine/cuda.h>). Plain C++ header: no CUDA includes.
#pragma once

#include <string>

namespace rg::cuda {

bool built_with_cuda();
// Number of usable CUDA devices; 0 when built without CUDA, or without a driver or GPU.
int device_count();
// "" when device_count() > 0; otherwise why there is no device, in one sentence ("no CUDA driver
// is installed (libcuda.so.1: cannot open shared object file ...)", "built without CUDA", ...).
std::string unavailable_reason();
// "NVIDIA H100 80GB HBM3 (sm_90)"; throws rg::Error for an invalid index.
std::string device_name(int index);
// "cudart 13000, cuBLAS 13.0.0, cuDNN 91000, NCCL 22800" or "built without CUDA". Needs no GPU,
// but loads cuBLAS, cuDNN and NCCL (see kernels/cuda/dynload.h): throws rg::Error naming the
// library that cannot be loaded.
std::string library_versions();
// Runs one trivial kernel (fill) on `index` and checks its result; throws rg::Error on failure.
void self_test(int index);

}  // namespace rg::cuda
