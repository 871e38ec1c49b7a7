// The switch between cuDNN and our own CUDA kernels for the ops that have both (batch_norm,
// avg_pool2d), like torch.backends.cudnn.enabled, and cuDNN's benchmark mode for conv2d, like
// torch.backends.cudnn.benchmark, and which cuDNN API runs the convolutions.
#pragma once

namespace rg {

// On by default. Off, batch norm and average pooling on CUDA run our own kernels, the checked
// fallback that also serves what cuDNN does not take. conv2d has no other CUDA path and always
// uses cuDNN.
void set_cudnn_enabled(bool enabled);
bool cudnn_enabled();

// Off by default. On, conv2d on CUDA chooses each pass's cuDNN algorithm (forward, input gradient,
// weight gradient) by running and timing the candidates (cudnnFind*) once per configuration
// (shapes, stride, padding, dilation, dtype, math, device) and caches it; off, it takes cuDNN's
// heuristic ranking. Under set_deterministic_algorithms(true) only deterministic algorithms are
// candidates either way. Timing makes the choice, and so the rounding, vary between runs: it is a
// speed setting, not a reproducible one. No effect on the CPU.
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();

// Which cuDNN API runs conv2d on CUDA: `graph` (the default), cuDNN's graph (backend) API with
// engines from its heuristics (mode A, then B, then its fallback list; with benchmark, mode A's
// usable engines timed), as PyTorch does, and the legacy API for a pass the graph API offers no
// usable engine for; or `legacy`, the legacy API only (cudnnGet*_v7 / cudnnFind*), for
// comparison. The same policy either way: deterministic engines only under
// set_deterministic_algorithms(true), no TF32 for f32 under set_allow_tf32_conv(false).
enum class CudnnConvApi { graph, legacy };
void set_cudnn_conv_api(CudnnConvApi api);
CudnnConvApi cudnn_conv_api();

}  // namespace rg
