// The cuDNN switches of engine/ops/cudnn.h: process-wide flags, read when an op runs (benchmark's
// in kernels/algorithm_policy.h, where cuDNN's convolution reads it).
#include "engine/ops/cudnn.h"

#include <atomic>

#include "kernels/algorithm_policy.h"

namespace rg {
namespace {
std::atomic<bool> enabled{true};
}  // namespace

void set_cudnn_enabled(bool on) { enabled.store(on); }
bool cudnn_enabled() { return enabled.load(); }
void set_cudnn_benchmark(bool on) { kernels::set_cudnn_benchmark(on); }
bool cudnn_benchmark() { return kernels::cudnn_benchmark(); }
void set_cudnn_conv_api(CudnnConvApi api) {
  kernels::set_cudnn_legacy_conv(api == CudnnConvApi::legacy);
}
CudnnConvApi cudnn_conv_api() {
  return kernels::cudnn_legacy_conv() ? CudnnConvApi::legacy : CudnnConvApi::graph;
}

}  // namespace rg
