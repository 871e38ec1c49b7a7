// Unscale + inf/NaN check over parallel chunks; a chunk that saw a non-finite value sets the flag.
#include "kernels/cpu/grad_scaler.h"

#include <atomic>
#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/error.h"

namespace rg::kernels::cpu {

template <class T>
bool unscale_check_finite(T* x, int64_t n, float inv_scale) {
  RG_CHECK(n >= 0, "cpu::unscale_check_finite: element count must be >= 0, got ", n);
  std::atomic<bool> found{false};
  const T inv = static_cast<T>(inv_scale);
  parallel_for(0, n, 1 << 15, [&](int64_t lo, int64_t hi) {
    bool saw = false;
    for (int64_t i = lo; i < hi; ++i) saw |= !std::isfinite(x[i]);
    if (inv != T(1)) {
      for (int64_t i = lo; i < hi; ++i) x[i] *= inv;
    }
    if (saw) found.store(true, std::memory_order_relaxed);
  });
  return found.load(std::memory_order_relaxed);
}

template bool unscale_check_finite<float>(float*, int64_t, float);
template bool unscale_check_finite<double>(double*, int64_t, float);

}  // namespace rg::kernels::cpu
