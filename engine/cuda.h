// CUDA device queries for users, like torch.cuda.device_count(): rg::cuda::device_count() (0, never
// an error, without a driver or GPU), unavailable_reason() (why there is no device),
// device_name(i), library_versions(). cuBLAS, cuDNN and NCCL are loaded at run time, not linked:
// library_versions() and the first CUDA op that needs one throw rg::Error naming what is missing.
// The TF32 switches (engine/tf32.h) are here too.
#pragma once

#include "engine/tf32.h"          // IWYU pragma: export
#include "kernels/cuda/device.h"  // IWYU pragma: export
