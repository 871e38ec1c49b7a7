// What the emulated cuDNN's legacy API (kernels/emu/cudnn.cpp) and its graph API
// (kernels/emu/cudnn_backend.cpp) share: the handle, the descriptor and call counters, and one
// convolution pass queued on the handle's stream and computed by the CPU convolution.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "kernels/conv2d.h"
#include "kernels/emu/device_runtime.h"
#include "kernels/emu/shim/cudnn.h"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};

namespace rg::emu::cudnn_detail {

// The descriptors of both APIs created and not yet destroyed (rg::emu::cudnn_live_descriptors).
extern std::atomic<int> live_descriptors;

// Counts one call of `name` for rg::emu::cudnn_calls, and reads the count.
void count_call(std::string_view name);
int64_t calls_of(std::string_view name);

// Queues one cuDNN call on its handle's stream with the memory it touches, counted by name.
void queue(cudnnHandle_t handle, const char* name, std::vector<MemAccess> accesses,
           std::function<void()> work);

// The bytes of one element of a data type the emulated convolution computes (f32, f64, f16,
// bf16); 0 for any other.
size_t element_bytes(cudnnDataType_t type);

// Completes g (every field but ho and wo set) with the output size, as cuDNN computes it: false
// when the dilated kernel does not fit the padded input.
bool complete_geometry(kernels::Conv2dGeometry& g);

enum class Pass { forward, data, weight };

// How the three operands of a pass lie in memory, their dimensions always in cuDNN's NCHW order
// (x [N, C, H, W], w [K, C, KH, KW], y [N, K, HO, WO]): packed NCHW, or packed NHWC (channels
// last, the filter KRSC). The CPU convolution is NCHW only: NHWC operands are transposed to NCHW
// before it and the result back after it, in the queued work.
enum class Layout { nchw, nhwc };

// One convolution pass: (a, b) -> out is (x, w) -> y forward, (w, dy) -> dx backward data,
// (x, dy) -> dw backward filter.
struct ConvCall {
  const char* name;  // a string literal: counted by cudnn_calls, named in race reports
  cudnnDataType_t type;
  bool tf32;  // f32 operands rounded to TF32 before the f32 arithmetic
  Pass pass;
  kernels::Conv2dGeometry g;
  Layout layout;
  const void* a;
  const void* b;
  void* out;
  // Scratch the call writes (an execution plan's workspace), declared to the race detector;
  // nullptr or 0 bytes: none.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Queues the pass on the handle's stream, declaring the reads of a and b and the writes of out
// and the workspace to the race detector; everything it needs is copied (the caller may destroy
// its descriptors as soon as the call returns, as cuDNN allows). CUDNN_STATUS_NOT_SUPPORTED for a
// data type not emulated.
cudnnStatus_t dispatch(cudnnHandle_t handle, const ConvCall& call);

}  // namespace rg::emu::cudnn_detail
