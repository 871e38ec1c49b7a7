// Stands in for the CUDA header <cuda_runtime.h> in emulated builds (kernels/emu/shim comes first
// on their include path), so .cu files keep their usual includes; everything is in cuda_emu.h.
#pragma once

#include "kernels/emu/cuda_emu.h"
