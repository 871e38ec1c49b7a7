// The flags of kernels/algorithm_policy.h: atomics, read when a kernel chooses an algorithm.
#include "kernels/algorithm_policy.h"

#include <atomic>

namespace rg::kernels {
namespace {
std::atomic<bool> deterministic{false};
std::atomic<bool> benchmark{false};
std::atomic<bool> legacy_conv{false};
}  // namespace

void set_deterministic_algorithms(bool on) { deterministic.store(on); }
bool deterministic_algorithms() { return deterministic.load(); }
void set_cudnn_benchmark(bool on) { benchmark.store(on); }
bool cudnn_benchmark() { return benchmark.load(); }
void set_cudnn_legacy_conv(bool on) { legacy_conv.store(on); }
bool cudnn_legacy_conv() { return legacy_conv.load(); }

}  // namespace rg::kernels
