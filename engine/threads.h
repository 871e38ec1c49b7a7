// How many CPU threads ringgrad uses (its own loops and OpenBLAS), as torch.set_num_threads /
// torch.get_num_threads, without including kernels/ headers.
#pragma once

namespace rg {

// The thread count: RG_NUM_THREADS when set, else hardware threads / LOCAL_WORLD_SIZE, until
// set_num_threads changes it.
int num_threads();

// Sets the thread count for every later CPU op; n must be positive (rg::Error otherwise).
void set_num_threads(int n);

}  // namespace rg
