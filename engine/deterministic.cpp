// engine/deterministic.h: the flag lives in kernels/algorithm_policy.h, read by the kernels that
// choose algorithms (cuDNN's convolution).
#include "engine/deterministic.h"

#include "kernels/algorithm_policy.h"

namespace rg {

void set_deterministic_algorithms(bool on) { kernels::set_deterministic_algorithms(on); }
bool deterministic_algorithms() { return kernels::deterministic_algorithms(); }

}  // namespace rg
