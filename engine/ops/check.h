// Boundary checks shared by ops (defined inputs, one dtype, one device) and the stream a CUDA op
// launches its kernels on.
#pragma once

#include <initializer_list>

#include "engine/tensor.h"
#include "kernels/backend.h"

namespace rg {

// The memory formats (MemoryFormat, engine/tensor.h) an op takes.
enum class Formats {
  contiguous,  // contiguous tensors only: the default, for ops that read memory by position
  alike,       // either format, every input in the same one (elementwise ops; the output too)
  any,         // each input in either format: the op handles each input's layout itself
};

// All tensors defined, on one device, with one dtype, and in memory formats the op takes: a
// channels_last tensor reaching an op that does not take it is an error naming the op (the
// safety net that keeps a layout from being read as another).
void check_inputs(const char* op, std::initializer_list<Tensor> tensors,
                  Formats formats = Formats::contiguous);
// For ops without a CUDA implementation yet: a clear "not implemented on CUDA yet" error naming
// the op when any tensor is on a CUDA device.
void check_cpu_only(const char* op, std::initializer_list<Tensor> tensors);
// The tensor has exactly `ndim` dimensions (message names the op and the expected layout).
void check_dim(const char* op, const Tensor& t, int64_t ndim, const char* layout);

// Whether an op may write its result over `x`, which its caller passed as a temporary: no other
// handle shares x's TensorImpl or its storage (so nothing, saved tensors included, can read it
// again), the storage is exactly x, and x is not a leaf that requires grad. Forward activations
// that are consumed once (batch norm's output going into relu) then need no second buffer.
bool reusable(const Tensor& x);

// The calling thread's current stream of t's CUDA device, as the void* (cudaStream_t) the
// kernels/cuda launchers take; makes t's device the current one, which launches go to.
void* cuda_stream(const Tensor& t);

// The execution context of a kernel working on t: on CUDA the calling thread's current stream of
// t's device (as cuda_stream), on the CPU the default thread budget.
kernels::Ctx kernel_ctx(const Tensor& t);

}  // namespace rg
