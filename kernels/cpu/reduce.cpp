// Sum reductions: contiguous rows accumulate in double; strided reductions add whole rows so
// the inner loop stays vectorizable.
#include "kernels/cpu/reduce.h"

#include <Eigen/Core>
#include <algorithm>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace rg::kernels::cpu {

template <class T>
void sum_dim(const T* in, T* out, int64_t outer, int64_t r, int64_t inner) {
  if (inner == 1) {
    parallel_for(0, outer, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(r, 1)),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t o = lo; o < hi; ++o) {
                     const T* p = in + o * r;
                     double acc = 0;
                     for (int64_t k = 0; k < r; ++k) acc += double(p[k]);
                     out[o] = T(acc);
                   }
                 });
    return;
  }
  // Parallel over (outer x inner-chunks) so that reducing dim 0 of a (N, F) tensor still splits.
  const int64_t kChunk = 1024;
  const int64_t chunks_per_outer = (inner + kChunk - 1) / kChunk;
  parallel_for(0, outer * chunks_per_outer, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t job = lo; job < hi; ++job) {
      const int64_t o = job / chunks_per_outer;
      const int64_t i0 = (job % chunks_per_outer) * kChunk;
      const int64_t len = std::min(kChunk, inner - i0);
      Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> acc(out + o * inner + i0, len);
      acc.setZero();
      for (int64_t k = 0; k < r; ++k) {
        acc += Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(in + (o * r + k) * inner + i0,
                                                                    len);
      }
    }
  });
}

template <class T>
double sum_all(const T* in, int64_t n) {
  const int threads = n < (1 << 16) ? 1 : num_threads();
  std::vector<double> partial(size_t(threads), 0.0);
  const int64_t per = (n + threads - 1) / std::max(threads, 1);
  parallel_for(0, threads, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t b = t * per, e = std::min(n, b + per);
      double acc = 0;
      for (int64_t i = b; i < e; ++i) acc += double(in[i]);
      partial[size_t(t)] = acc;
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

template void sum_dim<float>(const float*, float*, int64_t, int64_t, int64_t);
template void sum_dim<double>(const double*, double*, int64_t, int64_t, int64_t);
template double sum_all<float>(const float*, int64_t);
template double sum_all<double>(const double*, int64_t);

}  // namespace rg::kernels::cpu
