// rg::num_threads/set_num_threads: the engine's face of kernels/cpu/parallel.h's thread policy.
#include "engine/threads.h"

#include "kernels/cpu/parallel.h"

namespace rg {

int num_threads() { return kernels::cpu::num_threads(); }

void set_num_threads(int n) { kernels::cpu::set_num_threads(n); }

}  // namespace rg
