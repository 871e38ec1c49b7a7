// Calls a template lambda with the C++ type of a runtime DType:
//   dispatch_float(t.dtype(), "relu", [&]<class T>() { kernel<T>(...); });
// Ops state which dtypes they accept; anything else is a clear error naming the op.
#pragma once

#include "engine/cuda/stream_trace.h"
#include "engine/device.h"
#include "engine/dtype.h"
#include "kernels/backend.h"
#include "kernels/error.h"

namespace rg {

// f32 and f64: the dtypes of CPU compute.
template <class F>
decltype(auto) dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::f64:
      return f.template operator()<double>();
    default:
      RG_FAIL(op, ": expected a f32 or f64 tensor, got ", dtype_name(t),
              " (convert with .to(DType::f32))");
  }
}

// f32, f64, f16 and bf16: the dtypes of the CUDA kernels (the half types compute in f32).
template <class F>
decltype(auto) dispatch_cuda_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::f64:
      return f.template operator()<double>();
    case DType::f16:
      return f.template operator()<Half>();
    case DType::bf16:
      return f.template operator()<BFloat16>();
    default:
      RG_FAIL(op, ": expected a floating-point tensor (f32, f64, f16 or bf16) on CUDA, got ",
              dtype_name(t));
  }
}

// The one device dispatch of the engine: f.template operator()<T, B>() with B the backend tag of
// `device` (kernels::Cpu or kernels::Cuda, kernels/backend.h), for f32/f64 on the CPU and
// f32/f64/f16/bf16 on CUDA (the RG_*_FLOAT_TYPES lists). An op whose kernels have one contract
// calls them once, `kernels::Loss<B>::some_kernel(..., kernel_ctx(x))`; code that still differs per
// backend branches with `if constexpr (kOnCuda<B>)`. A CPU kernel is never instantiated for a
// half type.
template <class B>
inline constexpr bool kOnCuda = kernels::is_cuda_backend<B>;

// While tracing, the work dispatched to a CUDA device is one span on its stream's lane, named
// after `op` in the current module scope (cuda::OpSpan; only the outermost span open on the
// thread records, so an op run inside a backward node's or an optimizer step's span is not
// counted twice). This is the one place where ops get their spans.
template <class F>
decltype(auto) dispatch_on(Device device, DType t, const char* op, F&& f) {
  if (device.is_cuda()) {
    const cuda::OpSpan span(op, "op", device);
    return dispatch_cuda_float(
        t, op, [&]<class T>() { return f.template operator()<T, kernels::Cuda>(); });
  }
  return dispatch_float(t, op, [&]<class T>() { return f.template operator()<T, kernels::Cpu>(); });
}

// Every dtype.
template <class F>
decltype(auto) dispatch_all(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::f64:
      return f.template operator()<double>();
    case DType::f16:
      return f.template operator()<Half>();
    case DType::bf16:
      return f.template operator()<BFloat16>();
    case DType::i64:
      return f.template operator()<int64_t>();
    case DType::i32:
      return f.template operator()<int32_t>();
    case DType::u8:
      return f.template operator()<uint8_t>();
  }
  RG_ASSERT(false, "dtype enum value ", static_cast<int>(t), " is not a DType");
  __builtin_unreachable();
}

}  // namespace rg
