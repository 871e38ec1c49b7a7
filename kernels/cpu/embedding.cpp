// The embedding kernels on the CPU (kernels/embedding.h). The forward copies rows in parallel over
// the indices; the backward runs over chunks of the d columns in parallel, each chunk adding the
// gradient rows in position order, so its sums do not depend on the thread count.
#include "kernels/embedding.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {
constexpr int64_t kGrain = 1 << 14;  // elements per parallel chunk

bool valid_index(int64_t r, int64_t v) { return r >= 0 && r < v; }
}  // namespace

template <>
template <class T>
void Embedding<Cpu>::embedding(const T* weight, const int64_t* indices, T* out, int64_t* first_bad,
                               int64_t n, int64_t v, int64_t d, Ctx ctx) {
  detail::check_embedding_sizes("embedding", n, v, d);
  first_bad[0] = n;
  first_bad[1] = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!valid_index(indices[i], v)) {
      first_bad[0] = i;
      first_bad[1] = indices[i];
      break;
    }
  }
  if (n == 0 || d == 0) return;
  cpu::parallel_for(
      0, n, std::max<int64_t>(1, kGrain / d),
      [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const int64_t r = indices[i];
          T* o = out + i * d;
          if (valid_index(r, v)) {
            std::copy_n(weight + r * d, d, o);
          } else {
            std::fill_n(o, d, std::numeric_limits<T>::quiet_NaN());
          }
        }
      },
      ctx.threads);
}

template <>
template <class T>
int64_t Embedding<Cpu>::embedding_backward_workspace_bytes(int64_t, int64_t) {
  return 0;  // f32 and f64 are their own compute types: the sums go straight to grad_weight
}

template <>
template <class T>
void Embedding<Cpu>::embedding_backward(const T* grad, const int64_t* indices, T* grad_weight,
                                        int64_t n, int64_t v, int64_t d, int64_t padding_idx,
                                        Workspace, Ctx ctx) {
  detail::check_embedding_sizes("embedding_backward", n, v, d);
  detail::check_padding_idx("embedding_backward", padding_idx, v);
  std::fill_n(grad_weight, v * d, T(0));
  if (n == 0 || d == 0) return;
  cpu::parallel_for(
      0, d, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)),
      [&](int64_t lo, int64_t hi) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t r = indices[i];
          if (!valid_index(r, v) || r == padding_idx) continue;
          const T* g = grad + i * d;
          T* gw = grad_weight + r * d;
          for (int64_t k = lo; k < hi; ++k) gw[k] += g[k];
        }
      },
      ctx.threads);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_embedding_kernels() {
  using K = Embedding<Cpu>;
  return std::tuple{&K::embedding<T>, &K::embedding_backward_workspace_bytes<T>,
                    &K::embedding_backward<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_embedding_kernels)

}  // namespace rg::kernels
