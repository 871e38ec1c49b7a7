// One-time environment fix-up by re-exec; see runtime_env.h for why.
#include "kernels/cpu/runtime_env.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

extern "C" char* openblas_get_corename(void);

namespace rg::kernels::cpu {

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name ? std::string(name) : std::string("unknown");
}

void ensure_runtime_env(int argc, char** argv) {
  (void)argc;
  if (std::getenv("RG_NO_REEXEC") != nullptr || std::getenv("RG_ENV_APPLIED") != nullptr) return;
  bool changed = false;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    const std::string core = blas_core_name();
    const char* better = nullptr;
    if (core == "Prescott" || core == "Nehalem" || core == "Sandybridge" || core == "Core2") {
      __builtin_cpu_init();
      if (__builtin_cpu_supports("avx512f")) {
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
  if (!changed) return;
  setenv("RG_ENV_APPLIED", "1", 1);  // never loop
  execv("/proc/self/exe", argv);
  // execv only returns on failure: carry on with the environment we have.
}

}  // namespace rg::kernels::cpu
