// Checks of every collective on one rank of a group, shared by the in-process (threads as ranks)
// tests and the multi-process tests that ringgrad-run starts. Each fills its inputs with values
// that depend on rank and index and are exact in every dtype, runs the collective and compares
// element by element (gtest failures name rank, dtype, count and the first wrong index).
#pragma once

#include <cstddef>

#include "comm/process_group.h"

namespace rg::testing {

void check_all_reduce(dist::ProcessGroup& pg, DType dtype, size_t count, dist::ReduceOp op);
void check_broadcast(dist::ProcessGroup& pg, DType dtype, size_t count, int root);
void check_all_gather(dist::ProcessGroup& pg, DType dtype, size_t count);
void check_reduce_scatter(dist::ProcessGroup& pg, DType dtype, size_t block, dist::ReduceOp op);
// Rank r sends to r+1 and receives from r-1 (a ring of send/recv pairs).
void check_send_recv(dist::ProcessGroup& pg, DType dtype, size_t count);

// Every collective, every dtype that collectives take, sizes 0, 1, size-1, size+1, 1000 and one
// that spans several ring chunks. `heavy` adds a 1 MiB-ish case.
void check_everything(dist::ProcessGroup& pg, bool heavy);
// A 64 MiB all-reduce (one element more) and broadcast in f32: many chunks of NCCL's and our
// ring's pipelines, the sizes DDP buckets reach. For process groups with their default chunking.
void check_64_mib(dist::ProcessGroup& pg);

}  // namespace rg::testing
