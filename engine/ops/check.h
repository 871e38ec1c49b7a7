// Boundary checks shared by ops: defined inputs, same dtype, same device, CPU-only for now.
#pragma once

#include <initializer_list>

#include "engine/tensor.h"

namespace rg {

// All tensors defined, on one device, with one dtype; CUDA tensors are refused with a clear
// "not implemented on CUDA yet" until the CUDA backend lands.
void check_inputs(const char* op, std::initializer_list<Tensor> tensors);
// The tensor has exactly `ndim` dimensions (message names the op and the expected layout).
void check_dim(const char* op, const Tensor& t, int64_t ndim, const char* layout);

}  // namespace rg
