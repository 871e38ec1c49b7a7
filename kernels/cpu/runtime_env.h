// Process environment that must be fixed before OpenBLAS and OpenMP start, applied by re-executing
// the program once at the top of main():
//  - OPENBLAS_CORETYPE: Debian's OpenBLAS 0.3.21 does not recognise newer Xeons and falls back to
//    generic "Prescott" SSE3 kernels (about 5x slower sgemm), and may give AMD's AVX-512 CPUs
//    its AVX2 kernels ("Zen", "Haswell"); we pick SkylakeX or Haswell from the CPU's own feature
//    flags.
//  - GOMP_SPINCOUNT=2000: idle OpenMP workers spin briefly and then sleep, so a process shares
//    the machine with other ranks or jobs without slowing small ops (see runtime_env.cpp for the
//    measurements); unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set.
//  - OPENBLAS_THREAD_TIMEOUT=4: OpenBLAS's idle workers sleep at once instead of calling
//    sched_yield for about 0.1 s after each GEMM, which took the cores of the ops that follow
//    (ToyNet, MLP and gpt-nano trained 1.0-1.9x as fast on 2 cores; runtime_env.cpp); unless it or
//    GOTO_THREAD_TIMEOUT is set.
// Values the user set are kept. RG_NO_REEXEC=1 disables the re-exec.
#pragma once

#include <string>

namespace rg::kernels::cpu {

// Re-executes the program (kernels/cpu/self_exec.h: its own file, name and argv) with the
// variables above when they are missing; returns when nothing needs to change (or the re-exec is
// disabled or impossible).
void ensure_runtime_env(int argc, char** argv);

// The OpenBLAS kernel family in use, e.g. "SkylakeX" or "Prescott".
std::string blas_core_name();

}  // namespace rg::kernels::cpu
