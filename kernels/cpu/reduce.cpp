// Reduce<Cpu> (kernels/reduce.h): contiguous rows accumulate in f64 one row per task; strided
// reductions add whole rows into an f64 accumulator per chunk of columns, so the inner loop stays
// vectorizable; sum_all adds fixed chunks in parallel and the chunks in order.
#include "kernels/reduce.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <tuple>

#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {

constexpr int64_t kColumnChunk = 1024;

// out = scale * sum over r (scale 1 for sums).
template <class T>
void reduce_dim(const T* in, T* out, int64_t outer, int64_t r, int64_t inner, double scale,
                Ctx ctx) {
  if (outer == 0 || inner == 0) return;
  if (inner == 1) {
    cpu::parallel_for(
        0, outer, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(r, 1)),
        [&](int64_t lo, int64_t hi) {
          for (int64_t o = lo; o < hi; ++o) {
            const T* p = in + o * r;
            double acc = 0;
            for (int64_t k = 0; k < r; ++k) acc += double(p[k]);
            out[o] = T(acc * scale);
          }
        },
        ctx.threads);
    return;
  }
  // Parallel over (outer x column chunks) so that reducing dim 0 of a (N, F) tensor still splits.
  const int64_t chunks_per_outer = (inner + kColumnChunk - 1) / kColumnChunk;
  cpu::parallel_for(
      0, outer * chunks_per_outer, 1,
      [&](int64_t lo, int64_t hi) {
        Eigen::Array<double, Eigen::Dynamic, 1> acc(kColumnChunk);
        for (int64_t job = lo; job < hi; ++job) {
          const int64_t o = job / chunks_per_outer;
          const int64_t i0 = (job % chunks_per_outer) * kColumnChunk;
          const int64_t len = std::min(kColumnChunk, inner - i0);
          auto a = acc.head(len);
          a.setZero();
          for (int64_t k = 0; k < r; ++k) {
            a += Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(in + (o * r + k) * inner + i0,
                                                                      len)
                     .template cast<double>();
          }
          Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(out + o * inner + i0, len) =
              (a * scale).template cast<T>();
        }
      },
      ctx.threads);
}

template <class T>
void reduce_all(const char* op, const T* in, int64_t n, T* out, Workspace workspace, double scale,
                Ctx ctx) {
  RG_CHECK(n >= 0, op, ": n must be non-negative, got ", n);
  const int64_t parts = Reduce<Cpu>::sum_all_partials(n);
  RG_ASSERT(workspace.data != nullptr && workspace.bytes >= Reduce<Cpu>::sum_all_workspace_bytes(n),
            op, ": needs a workspace of ", Reduce<Cpu>::sum_all_workspace_bytes(n), " bytes");
  double* partial = static_cast<double*>(workspace.data);
  cpu::parallel_for(
      0, parts, 1,
      [&](int64_t lo, int64_t hi) {
        for (int64_t b = lo; b < hi; ++b) {
          double acc = 0;
          for (int64_t i = n * b / parts; i < n * (b + 1) / parts; ++i) acc += double(in[i]);
          partial[b] = acc;
        }
      },
      ctx.threads);
  double total = 0;
  for (int64_t b = 0; b < parts; ++b) total += partial[b];
  out[0] = T(total * scale);
}

}  // namespace

template <>
template <class T>
void Reduce<Cpu>::sum_dim(const T* in, T* out, int64_t outer, int64_t r, int64_t inner, Ctx ctx) {
  detail::check_reduce_sizes("sum_dim", outer, r, inner);
  reduce_dim(in, out, outer, r, inner, 1.0, ctx);
}

template <>
template <class T>
void Reduce<Cpu>::mean_dim(const T* in, T* out, int64_t outer, int64_t r, int64_t inner, Ctx ctx) {
  detail::check_reduce_sizes("mean_dim", outer, r, inner);
  reduce_dim(in, out, outer, r, inner, 1.0 / double(r), ctx);
}

template <>
template <class T>
void Reduce<Cpu>::sum_all(const T* in, int64_t n, T* out, Workspace workspace, Ctx ctx) {
  reduce_all("sum_all", in, n, out, workspace, 1.0, ctx);
}

template <>
template <class T>
void Reduce<Cpu>::mean_all(const T* in, int64_t n, T* out, Workspace workspace, Ctx ctx) {
  reduce_all("mean_all", in, n, out, workspace, 1.0 / double(n), ctx);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_reduce_kernels() {
  using K = Reduce<Cpu>;
  return std::tuple{&K::sum_dim<T>, &K::mean_dim<T>, &K::sum_all<T>, &K::mean_all<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_reduce_kernels)

}  // namespace rg::kernels
