// Conv2d<Cuda>'s convolutions through cuDNN's graph (backend) API (kernels/cuda/conv2d_graph.cu),
// for kernels/cuda/conv2d.cu, which falls back to cuDNN's legacy API where this offers no engine.
// Internal to the .cu files: it includes <cudnn.h> (the emulated one under the emulator).
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <string>

#include "kernels/conv2d.h"

namespace rg::kernels::cuda {

// The cuDNN passes, each with its own engine (or algorithm) and workspace.
enum class CudnnPass { forward, backward_data, backward_weight };

const char* pass_name(CudnnPass pass);

// "the conv2d forward of 3x2x5x5 (NCHW), 3 filters of 3x3, stride 1x1, padding 1x1, dilation 1x1":
// a configuration as errors and the choice log name it.
std::string describe(const Conv2dGeometry& g, CudnnPass pass);

// RG_CUDNN_LOG=1 (read at each choice): every convolution algorithm choice, once per
// configuration, as one stderr line "ringgrad: cuDNN <api>: <describe(g, pass)>, <dtype>: <what>".
void log_choice(const char* api, const Conv2dGeometry& g, CudnnPass pass, cudnnDataType_t type,
                const std::string& what);

// The cuDNN tensor format of a convolution's arrays: NHWC for channels last, else NCHW.
inline cudnnTensorFormat_t tensor_format(const Conv2dGeometry& g) {
  return g.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
}

namespace conv_graph {

// The workspace the graph API's plan for `pass` needs, its operands assumed 16-byte aligned (as
// the caching allocator's blocks are), or -1 when the graph API has no usable engine for it: the
// caller then takes the legacy API. Chooses (and with benchmark, times) the engine on first use.
int64_t workspace_bytes(const Conv2dGeometry& g, CudnnPass pass, cudnnDataType_t type,
                        bool allow_tf32, void* stream);

// Runs `pass` through the graph API: (a, b) -> out is (x, w) -> y forward, (w, gy) -> gx
// backward data, (x, gy) -> gw backward weight. Returns false, running nothing, when the graph API
// has no usable engine for it or its plan needs more workspace than given (the caller then runs
// the legacy API within the workspace given). Operands less than 16-byte aligned get a plan of
// their own within the workspace given. A configuration first seen inside a CUDA graph capture is
// an error (choosing and building a plan cannot be captured).
bool run(const Conv2dGeometry& g, CudnnPass pass, cudnnDataType_t type, bool allow_tf32,
         const void* a, const void* b, void* out, void* workspace, int64_t workspace_bytes,
         void* stream);

}  // namespace conv_graph
}  // namespace rg::kernels::cuda
