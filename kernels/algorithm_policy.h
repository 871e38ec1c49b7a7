// The process-wide algorithm policy that the engine sets (rg::set_deterministic_algorithms in
// engine/deterministic.h, rg::set_cudnn_benchmark in engine/ops/cudnn.h) and the kernels that
// choose between algorithms (cuDNN's convolution, kernels/cuda/conv2d.cu) read when they run.
// It lives here, the bottom layer, because the choice is made below the engine's op boundary; the
// engine's functions are the public API.
#pragma once

namespace rg::kernels {

// torch.use_deterministic_algorithms: only algorithms that give the same bits run to run.
void set_deterministic_algorithms(bool on);
bool deterministic_algorithms();

// torch.backends.cudnn.benchmark: cuDNN's convolution times its candidate algorithms once per
// configuration instead of taking its heuristic's ranking.
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();

// Which cuDNN API runs the convolutions (kernels/cuda/conv2d.cu): off (the default), the graph
// (backend) API's engines, as PyTorch does, with the legacy API as the fallback where the graph
// API offers no engine; on, the legacy API only, for comparison (rg::set_cudnn_conv_api).
void set_cudnn_legacy_conv(bool on);
bool cudnn_legacy_conv();

}  // namespace rg::kernels
