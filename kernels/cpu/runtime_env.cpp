// One-time environment fix-up by re-exec; see runtime_env.h for why.
#include "kernels/cpu/runtime_env.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "kernels/cpu/self_exec.h"

extern char** environ;

extern "C" char* openblas_get_corename(void);

namespace rg::kernels::cpu {

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name ? std::string(name) : std::string("unknown");
}

void ensure_runtime_env(int argc, char** argv) {
  (void)argc;
  if (std::getenv("RG_NO_REEXEC") != nullptr) return;
  if (std::getenv("RG_ENV_APPLIED") != nullptr) {
    // Re-executed (or a child of a program that was): named "exe" only after exec_self's fallback.
    restore_program_name();
    return;
  }
  bool changed = false;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    const std::string core = blas_core_name();
    const char* better = nullptr;
    // OpenBLAS 0.3.21 does not know newer Xeons (it falls back to SSE3 kernels), and its AMD
    // table predates AVX-512 on Zen ("Zen" and "Haswell" are AVX2 kernels): use its AVX-512
    // kernels wherever the CPU has the AVX-512 subsets they use. Measured on a 2-core AMD EPYC
    // with AVX-512, forcing each with OPENBLAS_CORETYPE: SkylakeX took 24% less CPU time than
    // Haswell for a ToyNet training run (ringgrad-bench train --threads 1, perf stat task-clock,
    // 1420 vs 1880 ms, 3 alternating runs each).
    const bool old_core = core == "Prescott" || core == "Nehalem" || core == "Sandybridge" ||
                          core == "Core2" || core == "Haswell" || core == "Zen";
    if (old_core) {
      __builtin_cpu_init();
      if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
        better = "SkylakeX";
      } else if (__builtin_cpu_supports("avx2")) {
        better = "Haswell";
      }
    }
    if (better != nullptr && core != better) {
      setenv("OPENBLAS_CORETYPE", better, 1);
      changed = true;
    }
  }
  // OpenMP workers that spin while waiting for work take a core from whatever else runs there
  // (another rank, another job); workers that sleep at once pay a futex wake-up per parallel
  // region, which makes small ops several times slower. libgomp's default spins about 300000
  // iterations; 2000 keeps back-to-back regions fast and then sleeps. Measured on 2 cores:
  // ResNet-18 at 2 threads next to a process spinning on one core 44-48 img/s by default, 73 with
  // 2000, 71 with OMP_WAIT_POLICY=passive; a small conv2d fwd+bwd (rg_op_table_bench, 2 threads)
  // 38 us by default, 37 with 2000, 578 passive. Users who want otherwise set OMP_WAIT_POLICY or
  // GOMP_SPINCOUNT themselves.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr) {
    setenv("GOMP_SPINCOUNT", "2000", 1);
    changed = true;
  }
  // OpenBLAS's own worker threads (Debian's OpenBLAS is the pthreads build) wait for the next GEMM
  // by calling sched_yield for 2^28 cycles (about 0.1 s) before they sleep, so after every GEMM
  // they take cores from the ops that follow it on our OpenMP threads. 2^OPENBLAS_THREAD_TIMEOUT
  // cycles (OpenBLAS's minimum, 4: they sleep at once, and the next GEMM wakes them) measured on 2
  // cores, ringgrad-bench train at 2 threads, median img/s or tok/s of 5 alternating runs, default
  // -> 4, with OpenBLAS's AVX2 | AVX-512 kernels: ToyNet b64 2299 -> 2589 | 1392 -> 2677, MLP b64
  // 8153 -> 13234 | 16374 -> 16580, gpt-nano b8 31017 -> 41723 | 32704 -> 45721, ResNet-18 b16
  // 74.0 -> 74.0 | 67.2 -> 67.6 (its convolutions run on oneDNN). Unless the user set it (or
  // GOTO_THREAD_TIMEOUT, which OpenBLAS also reads).
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr &&
      std::getenv("GOTO_THREAD_TIMEOUT") == nullptr) {
    setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
    changed = true;
  }
  if (!changed) return;
  setenv("RG_ENV_APPLIED", "1", 1);  // never loop
  // Under the program's own name and argv (self_exec.h): ps and pgrep -x show what was started.
  exec_self(argv, environ);
  // exec_self only returns on failure: carry on with the environment we have.
}

}  // namespace rg::kernels::cpu
