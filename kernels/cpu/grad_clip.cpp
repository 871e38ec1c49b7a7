// The gradient clipping kernels on the CPU (kernels/grad_clip.h): per-chunk f64 partial norms in
// parallel, added (or maximized) in chunk order; the scaling and clamp as parallel loops.
#include "kernels/grad_clip.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "kernels/cpu/parallel.h"

namespace rg::kernels {
namespace {

constexpr int64_t kGrain = 1 << 14;  // elements per parallel chunk

// max that lets NaN win, as the CUDA MaxOp.
double nan_max(double a, double b) { return (a > b || a != a) ? a : b; }

}  // namespace

template <>
template <class T>
void GradClip<Cpu>::norm_accumulate(const T* x, int64_t n, double p, double* acc,
                                    Workspace workspace, Ctx ctx) {
  detail::check_norm_type("norm_accumulate", p);
  detail::check_clip_size("norm_accumulate", n);
  RG_ASSERT(workspace.data != nullptr && workspace.bytes >= norm_workspace_bytes(n),
            "norm_accumulate: workspace too small");
  double* partial = static_cast<double*>(workspace.data);
  const bool inf = std::isinf(p);
  cpu::parallel_for(
      0, kNormBlocks, 1,
      [&](int64_t lo, int64_t hi) {
        for (int64_t b = lo; b < hi; ++b) {
          double v = 0;
          for (int64_t i = n * b / kNormBlocks; i < n * (b + 1) / kNormBlocks; ++i) {
            const double a = std::abs(double(x[i]));
            if (inf) {
              v = nan_max(v, a);
            } else {
              v += p == 2.0 ? a * a : p == 1.0 ? a : std::pow(a, p);
            }
          }
          partial[b] = v;
        }
      },
      ctx.threads);
  double total = acc[0];
  for (int64_t b = 0; b < kNormBlocks; ++b)
    total = inf ? nan_max(total, partial[b]) : total + partial[b];
  acc[0] = total;
}

template <>
template <class T>
void GradClip<Cpu>::norm_finish(const double* acc, double p, T* out, Ctx) {
  detail::check_norm_type("norm_finish", p);
  const double a = acc[0];
  out[0] = T(p == 1.0 || std::isinf(p) ? a : p == 2.0 ? std::sqrt(a) : std::pow(a, 1.0 / p));
}

template <>
template <class T>
void GradClip<Cpu>::scale_by_clip_coef(T* x, int64_t n, const T* total_norm, double max_norm,
                                       Ctx ctx) {
  detail::check_clip_size("scale_by_clip_coef", n);
  const T coef = T(max_norm) / (total_norm[0] + T(1e-6));
  const T c = coef > T(1) ? T(1) : coef;  // NaN stays NaN
  cpu::parallel_for(
      0, n, kGrain,
      [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) x[i] *= c;
      },
      ctx.threads);
}

template <>
template <class T>
void GradClip<Cpu>::clamp(T* x, int64_t n, double lo, double hi, Ctx ctx) {
  detail::check_clip_size("clamp", n);
  const T l = T(lo), h = T(hi);
  cpu::parallel_for(
      0, n, kGrain,
      [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) {
          const T v = x[i];
          x[i] = v < l ? l : v > h ? h : v;  // NaN compares false both ways and stays
        }
      },
      ctx.threads);
}

// Not in an unnamed namespace (see RG_INSTANTIATE in kernels/backend.h).
template <class T>
auto cpu_grad_clip_kernels() {
  using K = GradClip<Cpu>;
  return std::tuple{&K::norm_accumulate<T>, &K::norm_finish<T>, &K::scale_by_clip_coef<T>,
                    &K::clamp<T>};
}
RG_INSTANTIATE(RG_CPU_FLOAT_TYPES, cpu_grad_clip_kernels)

}  // namespace rg::kernels
