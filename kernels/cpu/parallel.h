// The one place that decides how many CPU threads ringgrad uses (RG_NUM_THREADS, default:
// hardware threads / LOCAL_WORLD_SIZE) and a parallel_for over index ranges built on OpenMP.
#pragma once

#include <cstdint>
#include <functional>

namespace rg::kernels::cpu {

// Threads for our loops and for OpenBLAS. Read once from the environment, changeable later.
int num_threads();
void set_num_threads(int n);

// Runs fn(begin_i, end_i) over [begin, end) split into at most num_threads() chunks of at least
// `grain` indices (at most max_threads chunks when it is positive: a kernel's Ctx::threads).
// Runs inline when the range is small or we are already inside a parallel region.
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn, int max_threads = 0);

}  // namespace rg::kernels::cpu
