// The flags of kernels/algorithm_policy.h: two atomics, read when a kernel chooses an algorithm.
#include "kernels/algorithm_policy.h"

#include <atomic>

namespace rg::kernels {
namespace {
std::atomic<bool> deterministic{false};
std::atomic<bool> benchmark{false};
}  // namespace

void set_deterministic_algorithms(bool on) { deterministic.store(on); }
bool deterministic_algorithms() { return deterministic.load(); }
void set_cudnn_benchmark(bool on) { benchmark.store(on); }
bool cudnn_benchmark() { return benchmark.load(); }

}  // namespace rg::kernels
