// Stands in for the CUDA header <cuda_runtime_api.h> in emulated builds (kernels/emu/shim comes
// first on their include path), so .cu files keep their usual includes; everything is in
// cuda_emu.h, and cudaGetDeviceProperties in device_properties.h.
#pragma once

#include "kernels/emu/cuda_emu.h"
#include "kernels/emu/device_properties.h"
