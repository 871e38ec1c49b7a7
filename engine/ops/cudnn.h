// The switch between cuDNN and our own CUDA kernels for the ops that have both (batch_norm,
// avg_pool2d), like torch.backends.cudnn.enabled, and cuDNN's benchmark mode for conv2d, like
// torch.backends.cudnn.benchmark.
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

}  // namespace rg
