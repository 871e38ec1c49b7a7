// Philox fills, parallel over counter blocks; output does not depend on the thread count.
#include "kernels/cpu/random.h"

#include "kernels/cpu/parallel.h"
#include "kernels/philox.h"

namespace rg::kernels::cpu {

template <class T>
void uniform(T* out, int64_t n, T low, T high, uint64_t seed, uint64_t offset) {
  const int64_t groups = (n + 3) / 4;
  parallel_for(0, groups, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g) {
      const philox::U32x4 r = philox::block(seed, offset + uint64_t(g));
      for (int64_t j = 0; j < 4 && 4 * g + j < n; ++j) {
        out[4 * g + j] = low + (high - low) * T(philox::to_uniform(r.v[j]));
      }
    }
  });
}

template <class T>
void normal(T* out, int64_t n, T mean, T stddev, uint64_t seed, uint64_t offset) {
  const int64_t groups = (n + 1) / 2;
  parallel_for(0, groups, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g) {
      const philox::U32x4 r = philox::block(seed, offset + uint64_t(g));
      out[2 * g] = mean + stddev * T(philox::box_muller(r.v[0], r.v[1]));
      if (2 * g + 1 < n) out[2 * g + 1] = mean + stddev * T(philox::box_muller(r.v[2], r.v[3]));
    }
  });
}

template void uniform<float>(float*, int64_t, float, float, uint64_t, uint64_t);
template void uniform<double>(double*, int64_t, double, double, uint64_t, uint64_t);
template void normal<float>(float*, int64_t, float, float, uint64_t, uint64_t);
template void normal<double>(double*, int64_t, double, double, uint64_t, uint64_t);

}  // namespace rg::kernels::cpu
