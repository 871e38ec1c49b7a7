// cudaGetDeviceProperties of the emulated runtime (kernels/emu/device_runtime.cpp) with the part
// of cudaDeviceProp ringgrad reads, above all the device's UUID; <cuda_runtime_api.h> brings it in
// emulated builds (kernels/emu/shim), as the real header does.
#pragma once

#include <cstddef>
#include <string>

#include "kernels/emu/runtime_api.h"

// A device's UUID, as CUDA's cudaUUID_t (nvidia-smi prints it as GPU-xxxxxxxx-xxxx-...).
typedef struct CUuuid_st {
  char bytes[16];
} cudaUUID_t;

// The fields of CUDA's cudaDeviceProp that ringgrad reads (the real struct has many more).
struct cudaDeviceProp {
  char name[256];
  cudaUUID_t uuid;
  size_t totalGlobalMem;
  int major;
  int minor;
  int multiProcessorCount;
};

// Each emulated device has a stable UUID derived from the emulated machine (RG_HOST_ID when set,
// else the host name) and its index: every process of one machine sees the same UUID for its
// device 0, so that ranks sharing an emulated GPU are found as on real GPUs.
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);

namespace rg::emu {
// The emulated machine (RG_HOST_ID when set, else the host name) and the UUID of its device
// `device`: a hash of both, the same in every process of that machine.
std::string emulated_machine_id();
cudaUUID_t device_uuid(int device);
}  // namespace rg::emu
